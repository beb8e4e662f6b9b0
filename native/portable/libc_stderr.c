/*
 * Only in the portable build (-DSVT_PORTABLE=ON), which links Debian's
 * libbpf.a into the addon so that a node needs no libbpf.
 *
 * Debian compiles its static libraries as position-independent *executable*
 * code. Such code reaches data of another module through a copy relocation
 * in the executable, so libbpf.a reads libc's `stderr` PC-relatively. In a
 * shared object (the .node) the linker cannot resolve that against libc and
 * refuses. Every other reference of libbpf.a to code outside it goes through
 * the PLT or GOT and links fine (checked with readelf -r: `stderr` is the only
 * one), and its own symbols are made local by --exclude-libs, ALL.
 *
 * This hidden definition gives that one reference a target inside the addon.
 * The constructor points it at the process's real stream before anything can
 * print, so libbpf's default printer (used until svctrace installs its own,
 * native/errors.cc) and svctrace's own messages still reach stderr.
 */
#define _GNU_SOURCE
#include <dlfcn.h>

struct _IO_FILE;

__attribute__((visibility("hidden"))) struct _IO_FILE *stderr;

__attribute__((constructor)) static void svt_bind_stderr(void) {
  struct _IO_FILE **process_stderr = dlsym(RTLD_DEFAULT, "stderr");
  if (process_stderr) stderr = *process_stderr;
}
