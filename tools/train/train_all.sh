#!/bin/sh
# Train the whole Fashion-MNIST model families and export them into models/fmnist/ (LlamaGen
# VQ + GPT + drafts) and models/fmnist-mar/ (MAR target and draft, continuous tokens).
#
#   tools/train/train_all.sh          (what `make train` runs)
#
# Resumable: a finished stage leaves tools/train/work/done/<stage> and is skipped; an
# interrupted stage resumes from its checkpoint (tools/train/work/<stage>/ckpt.pt).
# Logs: tools/train/work/logs/<stage>.log.  Start from scratch: rm -rf tools/train/work
#
# Order (independent stages run side by side on the 2 shared cores; "1" = one thread, "auto" =
# run-time choice between 1 and 2 threads, see common.ThreadTuner):
#   vq  ||  classifier
#   tokenize
#   target  ||  draft
#   distill  (the draft pulled towards the target's guided distribution)
#   eagle
#   eval  (cfg sweep -> defaults.cfg_scale in models/fmnist/vspec-model.json)
#   card  (models/fmnist/MODEL_CARD.md from the results)
#   mar_target  ||  mar_draft   (MAR on 4x4-patch tokens; independent of the stages above)
set -eu

cd "$(dirname "$0")/../.."
PY=${PYTHON:-/usr/bin/python3}
W=tools/train/work
mkdir -p "$W/logs" "$W/done" models/fmnist

stage() { # stage NAME THREADS CMD...   (THREADS: 1 = fixed single thread, auto = tuner)
	name=$1
	threads=$2
	shift 2
	if [ -e "$W/done/$name" ]; then
		echo "[train_all] $name: done, skipping"
		return 0
	fi
	echo "[train_all] $name: start $(date -u +%H:%M:%S) (log $W/logs/$name.log)"
	if VSPEC_TRAIN_THREADS=$threads nice -n 10 "$PY" "$@" >>"$W/logs/$name.log" 2>&1; then
		date -u +%FT%TZ >"$W/done/$name"
		echo "[train_all] $name: finished $(date -u +%H:%M:%S)"
	else
		echo "[train_all] $name: FAILED, see $W/logs/$name.log" >&2
		return 1
	fi
}

run_vq() { stage vq 1 tools/train/train_vq.py; }
run_classifier() { stage classifier 1 tools/train/train_classifier.py; }
run_tokenize() { stage tokenize auto tools/train/tokenize_codes.py; }
run_target() {
	stage target 1 tools/train/train_gpt.py --name target --dim 256 --n-layer 8 --n-head 4 \
		--steps 5500 --bs 32 --lr 5e-4
}
run_draft() {
	stage draft 1 tools/train/train_gpt.py --name draft --dim 128 --n-layer 4 --n-head 4 \
		--steps 9000 --bs 32 --lr 1e-3 --out "$W/draft/draft.safetensors"
}
# reads $W/draft/draft.safetensors, writes models/fmnist/draft.safetensors
run_distill() { stage distill 1 tools/train/distill_draft.py --steps 1200 --lr 3e-4; }
run_eagle() { stage eagle auto tools/train/train_eagle.py --steps 2000 --bs 32; }
run_eval() { stage eval auto tools/train/eval_samples.py; }
run_card() { stage card 1 tools/train/write_model_card.py; }
# MAR: the target about 8x the draft (models/fmnist-mar/MODEL_CARD.md).
run_mar_target() {
	stage mar_target 1 tools/train/train_mar.py --name mar_target --dim 160 --depth 3 --heads 4 \
		--head-width 160 --head-depth 2 --steps 16000 --bs 32 --lr 1e-3
}
run_mar_draft() {
	stage mar_draft 1 tools/train/train_mar.py --name mar_draft --dim 64 --depth 2 --heads 4 \
		--head-width 64 --head-depth 2 --steps 24000 --bs 32 --lr 1.5e-3
}
# train_all.sh mar: only the MAR family.
if [ "${1:-}" = mar ]; then
	mkdir -p models/fmnist-mar
	{ run_mar_target; } &
	a=$!
	{ run_mar_draft; } &
	b=$!
	r=0
	wait $a || r=1
	wait $b || r=1
	exit $r
fi

{ run_vq; } &
a=$!
{ run_classifier; } &
b=$!
r=0
wait $a || r=1
wait $b || r=1
[ $r -eq 0 ] || exit 1

run_tokenize

{ run_target; } &
a=$!
{ run_draft; } &
b=$!
r=0
wait $a || r=1
wait $b || r=1
[ $r -eq 0 ] || exit 1

run_distill
run_eagle
run_eval
rm -f "$W/done/card"
run_card
mkdir -p models/fmnist-mar
{ run_mar_target; } &
a=$!
{ run_mar_draft; } &
b=$!
r=0
wait $a || r=1
wait $b || r=1
[ $r -eq 0 ] || exit 1
echo "[train_all] all stages done; exports in models/fmnist/ and models/fmnist-mar/"
