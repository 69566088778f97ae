#!/usr/bin/env bash
# The committed reference run (embedded SmolLM2-135M-Instruct, fp32, this 2-core CPU). Each block writes
# the files named in results/README.md. Small limits so it finishes in ~15 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}

# measured from scratch: harness.run resumes a folder's records, so old ones would be kept, not re-timed
rm -rf results/ablation results/scaling results/sampling

# Paper Table 3 rows on MT-Bench: 2 questions x 2 turns, 64 new tokens per turn
$PY -m harness.run +experiment=ablation limit=2 max_new_tokens=64 data_dir=$DATA results_dir=results/ablation
$PY -m harness.tables ablation results/ablation --out results/ablation/analysis
$PY -m harness.report results/ablation --out results/ablation/analysis

# Scaling sweep (W = G in 1,3,5,10,15; N in 3,5,7) on MT-Bench: 2 questions x 2 turns, 48 new tokens
$PY -m harness.run +experiment=scaling limit=2 max_new_tokens=48 data_dir=$DATA results_dir=results/scaling
$PY -m harness.fit results/scaling --out results/scaling/analysis

# Table 2 (sampling quality) on XSum (CNN/DM has no offline copy here): 4 articles, 64 new tokens
$PY -m harness.run -m task=xsum decoder=ar,lookahead temperature=0,1.0 limit=4 max_new_tokens=64 \
    data_dir=$DATA results_dir=results/sampling
$PY -m harness.tables sampling results/sampling --out results/sampling/analysis
