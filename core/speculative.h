/*
 * core/speculative.h - speculative decoding jobs (core/speculative.c).
 */
#ifndef VS_SPECULATIVE_H
#define VS_SPECULATIVE_H

#include "core/engine.h"
#include "core/method.h"

int vs_generate_sd(vs_models *models, vspec_dev *dev, const vs_job *job, const vs_method *m,
                   int32_t *tokens, vs_metrics *mt, char *err, size_t errlen);

#endif /* VS_SPECULATIVE_H */
