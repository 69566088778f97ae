#!/usr/bin/env bash
# The reference run (embedded SmolLM2-135M-Instruct, fp32, this 2-core CPU). Three blocks, each writing the
# files named in results/README.md; each block runs its models, then its analysis:
#   ablation  paper Table 3: the nine rows on 20 MT-Bench questions x 2 turns, 256 new tokens
#             (timed: see results/README.md)
#   scaling   the W = G in {1,3,5,10,15} x N in {3,5,7} sweep on 10 MT-Bench questions x 2 turns, 128 new tokens
#             (timed: see results/README.md)
#   sampling  paper Table 2: ar and lookahead (paper defaults W=5, N=3, G=5 + prompt pool) at T = 0 and 1.0
#             on 40 CNN/DM and 40 XSum articles, 128 new tokens (the tasks' default, 1024, is the paper's)
#             (timed: see results/README.md)
#
# Usage: results/make_reference.sh [--clean] [--analysis-only] [ablation] [scaling] [sampling]
#   No block named: all three, in this order. Blocks run one after another in one call; to run them side by
#   side, start one call per block (each loads its own model): results/make_reference.sh ablation > ablation.log 2>&1 &
#   Resumes by default: harness.run skips every (prompt, turn) already in a run's records.jsonl, so a block
#   stopped at any point (Ctrl-C, kill, a lost machine) goes on where it stopped when started again.
#   Stages: each block runs its sweep at growing limits (ablation 5, 10, 20 questions; scaling 5, 10;
#   sampling 10, 20, 40 articles). A stage only adds the next prompts to every row, so wherever a block is
#   stopped after its first stage, all its rows share one prompt set (but the stage in progress).
#   Timings of a resumed block come from several sessions; keep the machine otherwise idle for speedups.
#   --clean          delete the named blocks' folders first (a fresh measurement, every prompt re-timed)
#   --analysis-only  skip the runs: tables / fit / report on whatever records exist now (also while a block
#                    still runs in the background). Intervals are 95% bootstrap CIs over prompts.
# Then, for the notebooks with stored outputs: .venv/bin/python notebooks/execute.py
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
# The stored reference was measured with torch's sdpa attention (before our attention kernel became the
# default on 2026-12-02). model.attn is part of a job's identity, so it is pinned here: a resumed block
# extends the same jobs instead of starting new ones beside them. ATTN=auto with --clean re-measures a
# block with our attention.
ATTN=${ATTN:-sdpa}

clean=0
run=1
blocks=()
for arg in "$@"; do
    case "$arg" in
        --clean) clean=1 ;;
        --analysis-only) run=0 ;;
        ablation|scaling|sampling) blocks+=("$arg") ;;
        -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
        *) echo "error: unknown argument '$arg' (blocks: ablation scaling sampling; flags: --clean --analysis-only)" >&2
           exit 2 ;;
    esac
done
[ ${#blocks[@]} -eq 0 ] && blocks=(ablation scaling sampling)

has_records() {  # analysis only where some records exist (a block stopped before its first prompt has none)
    if [ -n "$(find "results/$1" -name records.jsonl -size +0 2>/dev/null | head -n 1)" ]; then
        return 0
    fi
    echo "[$1] no records under results/$1 yet; analysis skipped"
    return 1
}

for block in "${blocks[@]}"; do
    if [ "$clean" = 1 ]; then
        echo "[$block] --clean: removing results/$block"
        rm -rf "results/$block"
    fi
    case "$block" in
        ablation)
            # Paper Table 3 rows on MT-Bench (conf/experiment/ablation.yaml); 2 turns per question
            if [ "$run" = 1 ]; then
                for limit in 5 10 20; do
                    $PY -m harness.run +experiment=ablation limit=$limit max_new_tokens=256 \
                        model.attn=$ATTN data_dir=$DATA results_dir=results/ablation
                done
            fi
            if has_records ablation; then
                $PY -m harness.tables ablation results/ablation --out results/ablation/analysis
                $PY -m harness.report results/ablation --out results/ablation/analysis
            fi ;;
        scaling)
            # Scaling sweep on MT-Bench (conf/experiment/scaling.yaml): S against per-step FLOPs, one curve per N
            if [ "$run" = 1 ]; then
                for limit in 5 10; do
                    $PY -m harness.run +experiment=scaling limit=$limit max_new_tokens=128 \
                        model.attn=$ATTN data_dir=$DATA results_dir=results/scaling
                done
            fi
            if has_records scaling; then
                $PY -m harness.fit results/scaling --out results/scaling/analysis
            fi ;;
        sampling)
            # Paper Table 2 (conf/experiment/sampling.yaml): task=cnn_dm,xsum decoder=ar,lookahead temperature=0,1.0
            if [ "$run" = 1 ]; then
                for limit in 10 20 40; do
                    $PY -m harness.run +experiment=sampling limit=$limit max_new_tokens=128 \
                        model.attn=$ATTN data_dir=$DATA results_dir=results/sampling
                done
            fi
            if has_records sampling; then
                $PY -m harness.tables sampling results/sampling --out results/sampling/analysis
                $PY -m harness.report results/sampling --out results/sampling/analysis
            fi ;;
    esac
done
