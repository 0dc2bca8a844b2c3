/*
 * bench/classes.h - a model's class names (vspec-model.json "class_names") where vspec-bench
 * talks about classes: --help lists those of the model directory, --class takes a name.
 */
#ifndef VS_BENCH_CLASSES_H
#define VS_BENCH_CLASSES_H

#include <stdio.h>

#include "core/models.h"

/* Writes "<indent>classes of DIR: 0 T-shirt/top, 1 Trouser, ..." wrapped at 80 columns, read
 * from DIR's manifest alone (no weights); nothing when it names no classes or cannot be read. */
void vs_bench_print_classes(FILE *f, const char *model_dir, const char *indent);

/* A --class argument against the loaded model: a label or a class name (core/models.h).
 * 1 with *label, or 0 after printing "vspec-bench CMD: <why>" on stderr. */
int vs_bench_class_arg(const char *cmd, const vs_models *m, const char *text, int *label);

#endif /* VS_BENCH_CLASSES_H */
