/*
 * bench/fmnist_data.h - Fashion-MNIST in IDX format, and the classifier's input layout.
 *
 * The data come from Debian's dataset-fashion-mnist (gzip-compressed IDX files, the format
 * of LeCun's MNIST page: a big-endian magic 0x00000803 for u8 images [n, rows, cols] and
 * 0x00000801 for u8 labels [n], then the dimensions as big-endian u32, then the bytes).
 * Everything read is validated: a bad magic, absurd dimensions, a truncated file, trailing
 * bytes or a corrupt gzip stream are errors that name the file.
 *
 * The quality classifier sees [1, 32, 32] floats in [-1, 1]: the 28x28 image padded by
 * 2 px of background (byte 0) on every side, then x/127.5 - 1. Generated images (RGB
 * bytes [32, 32, 3] from the VQ decoder) take the same path through byte values: a grey
 * byte from the channel mean, then the same affine map, so real and generated images are
 * quantised identically.
 */
#ifndef VS_BENCH_FMNIST_DATA_H
#define VS_BENCH_FMNIST_DATA_H

#include <stddef.h>
#include <stdint.h>

/* Where Debian's dataset-fashion-mnist installs the files. */
#define VS_FMNIST_DIR "/usr/share/datasets/fashion-mnist"
#define VS_FMNIST_SIDE 28
#define VS_FMNIST_CLASSES 10
/* Classifier input side: 28 + 2 * VS_FMNIST_PAD. */
#define VS_FMNIST_PAD 2
#define VS_CLF_SIDE 32

#define VS_IDX_MAGIC_U8_3D 0x00000803u /* images */
#define VS_IDX_MAGIC_U8_1D 0x00000801u /* labels */

/* Reads an IDX u8 image file ([n, rows, cols]); gzip-compressed or plain (zlib reads
 * both). max_n > 0 reads only the first min(n, max_n) images and then does not check the
 * rest of the file; max_n <= 0 reads all of it and rejects trailing bytes. *pixels is
 * malloc'ed [n, rows, cols]. Returns 0 or a negative vspec_status with a message naming
 * the file. */
int vs_idx_read_images(const char *path, int max_n, uint8_t **pixels, int *n, int *rows,
                       int *cols, char *err, size_t errlen);
/* The same for an IDX u8 label file ([n]). */
int vs_idx_read_labels(const char *path, int max_n, uint8_t **labels, int *n, char *err,
                       size_t errlen);

typedef struct vs_fmnist {
  int n;
  uint8_t *images; /* [n, 28, 28], 0 = background */
  uint8_t *labels; /* [n], 0..9 */
} vs_fmnist;

/* Loads DIR/SPLIT-images-idx3-ubyte.gz and DIR/SPLIT-labels-idx1-ubyte.gz, SPLIT "train"
 * (60000) or "t10k" (10000); dir NULL = VS_FMNIST_DIR. max_n as for vs_idx_read_images.
 * Checks 28x28 images, equal counts and labels < 10. */
int vs_fmnist_load(const char *dir, const char *split, int max_n, vs_fmnist *out, char *err,
                   size_t errlen);
void vs_fmnist_free(vs_fmnist *d);

/* A class-balanced choice of n of the n_labels images, the way vspec-bench eval asks for
 * classes (image i is class i mod classes): n / classes of every class, one more for each of
 * classes 0 .. n mod classes - 1; a class with too few images gives its shortfall to the next
 * classes that have images to spare, in class order. Within a class the first images in file
 * order are taken; idx [n] receives the indices in ascending order. Labels >= classes are
 * never taken. Deterministic: depends on the labels and n only. Returns 0, or VSPEC_EINVAL
 * when n < 0, classes is not in 1..256 or fewer than n images have a label below classes. */
int vs_fmnist_balanced(const uint8_t *labels, int n_labels, int classes, int n, int32_t *idx);

/* [n, 28, 28] bytes -> classifier input [n, 1, 32, 32]. */
void vs_fmnist_to_input(const uint8_t *images, int n, float *out);
/* [n, 32, 32, 3] RGB bytes -> classifier input [n, 1, 32, 32]; grey byte =
 * round((r + g + b) / 3) (the mean of three integers is never halfway, so rounding is
 * unambiguous; a grey image r = g = b keeps its bytes exactly). */
void vs_fmnist_rgb_to_input(const uint8_t *rgb, int n, float *out);
/* The byte -> [-1, 1] map shared by both paths. */
static inline float vs_fmnist_byte_to_input(uint8_t v) { return (float)v / 127.5f - 1.0f; }

#endif /* VS_BENCH_FMNIST_DATA_H */
