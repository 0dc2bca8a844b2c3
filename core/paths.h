/*
 * core/paths.h - where a program finds what was built or installed with it.
 *
 * The same binaries run from the build tree (build/vspecd, plugins in build/plugins) and
 * installed by `make install` (PREFIX/bin/vspecd, plugins in PREFIX/lib/vspec/plugins,
 * data in PREFIX/share/vspec). Paths are found relative to the running executable
 * (/proc/self/exe), never compiled in, so one build installs under any PREFIX or DESTDIR.
 */
#ifndef VS_PATHS_H
#define VS_PATHS_H

#include <stddef.h>

/* The running executable's directory; "" when /proc/self/exe cannot be read. */
void vs_exe_dir(char *out, size_t cap);

/* The default plugin directory: EXE_DIR/plugins when it exists (the build tree), else
 * EXE_DIR/../lib/vspec/plugins (an installed tree), else "build/plugins". */
void vs_default_plugin_dir(char *out, size_t cap);

/* The data file or directory `rel` (e.g. "models/fmnist"): `rel` itself when it exists
 * (relative to the working directory: the source tree), else EXE_DIR/../share/vspec/`rel`
 * when that exists, else `rel`. */
void vs_default_data_path(const char *rel, char *out, size_t cap);

#endif /* VS_PATHS_H */
