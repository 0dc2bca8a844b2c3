/*
 * core/png_meta.h - the text chunks that say how a generated image was made.
 *
 * Every PNG of a job (vspec-bench generate, vspecd's results and previews) carries
 *   vspec       vs_job_describe's line, "model=fmnist method=ar class=7 seed=1 ...": ours,
 *               every sampling setting, exact;
 *   parameters  the same for other programs, in the "infotext" form AUTOMATIC1111's web UI
 *               and stable-diffusion.cpp write and image browsers, "PNG info" tabs and model
 *               sites read: the prompt on the first line, then one line of "Key: value"
 *               pairs separated by ", ":
 *                 class 7 (Sneaker)
 *                 Steps: 64, Sampler: ar, CFG scale: 1.5, Seed: 1, Size: 32x32,
 *                 Model hash: 5f0c3e1a2b, Model: fmnist, Temperature: 1, Version: vspec 0.9.0
 *               The prompt is the class, with its name when the manifest has class_names
 *               (these models have no text prompt); Steps the
 *               tokens sampled (a continuous-token model's generation steps); Sampler the
 *               decoding method as it ran ("sd:exact@standard:shape=chain,depth=3"); Size
 *               the model's image; Model hash A1111's short hash (the first 10 hex digits of
 *               the SHA-256) of the target's weights file, when the model directory has a
 *               manifest that names it. A value with ',', ':' or a newline is written in
 *               JSON's double quotes, as A1111 quotes it, so that readers split the line
 *               right. Settings A1111 has no key for follow under vspec's own keys.
 *   Software    the program that wrote the file.
 */
#ifndef VS_PNG_META_H
#define VS_PNG_META_H

#include <stddef.h>
#include <stdint.h>

#include "core/job.h"
#include "core/models.h"
#include "core/png_write.h"

#define VS_PNG_META_TEXTS 3

typedef struct vs_png_meta {
  char describe[512];    /* the vspec chunk */
  char parameters[1024]; /* the parameters chunk */
  vs_png_text texts[VS_PNG_META_TEXTS];
} vs_png_meta;

/* Fills m for `job` as it ran on `models` (method resolved, sampling final) and returns the
 * number of texts in m->texts, for vs_png_encode or vs_png_write_file. */
int vs_png_meta_init(vs_png_meta *m, const vs_job *job, const vs_models *models,
                     const char *software);

/* The parameters text alone (as above); returns its length. */
size_t vs_png_parameters(const vs_job *job, const vs_models *models, char *buf, size_t cap);

/* Encodes rgb [image_h, image_w, 3] of models' target with the chunks of vs_png_meta_init
 * (vs_png_encode otherwise). */
int vs_png_encode_job(const uint8_t *rgb, const vs_job *job, const vs_models *models,
                      const char *software, uint8_t **out, size_t *out_len, char *err,
                      size_t errlen);

/* A1111's short hash of the target weights named by DIR's manifest: 10 lowercase hex digits
 * and a NUL into out. Read once per file and process (tens of ms for tens of MB), then
 * remembered while the manifest and the file keep their size, time and inode. Returns 0, or
 * -1 when there is no manifest or the file cannot be read (out is then ""). */
int vs_model_short_hash(const char *dir, char out[11]);

#endif /* VS_PNG_META_H */
