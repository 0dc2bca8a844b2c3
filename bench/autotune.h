/*
 * bench/autotune.h - tree=auto: choose the draft size that maximises expected tokens per
 * second on this machine.
 *
 * A method whose scheduler parameters contain size=auto is resolved before it runs:
 *   - the target's cost curve (median forward latency against tree nodes, CFG rows as the
 *     job uses them) is measured on this device;
 *   - each candidate size is run on a few calibration images (seeds of their own) to
 *     measure its acceptance: tokens per round, and its drafting and walk time per round;
 *   - the candidate with the most expected tokens per second,
 *       tokens_per_round / (target_forward_ms(nodes) + drafting_and_walk_ms_per_round),
 *     wins. Candidates: chain depth 1..8; dynamic trees total_tokens 2..58 (depth from the
 *     parameters, 4 by default); static trees chain1..chain4, fmnist, mc_sim_7b_63.
 * The resolved method (size=auto replaced by the chosen parameter) and a note with the
 * numbers are returned for the report.
 */
#ifndef VS_BENCH_AUTOTUNE_H
#define VS_BENCH_AUTOTUNE_H

#include "bench/bench.h"
#include "core/method.h"

/* Copies m->text to spec when no size=auto is asked for. */
int vs_autotune_resolve(vs_bench_env *env, vs_models *models, const vs_method *m, uint64_t seed,
                        char *spec, size_t spec_len, char *note, size_t note_len, char *err,
                        size_t errlen);

#endif /* VS_BENCH_AUTOTUNE_H */
