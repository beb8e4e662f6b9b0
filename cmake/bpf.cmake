# Rules that turn bpf/<name>.bpf.c into a libbpf skeleton header:
#   bpf/vmlinux/<arch>/vmlinux.h (committed) --copy--> vmlinux.h
#   <name>.bpf.c --clang -target bpf--> <name>.bpf.o --bpftool gen skeleton--> <name>.skel.h
# vmlinux.h is the one committed for the architecture, dumped from a pinned
# kernel's BTF (scripts/gen-vmlinux-h.sh says which, and why CO-RE makes that
# safe): the BPF objects come out the same whatever kernel the build machine
# runs. -DSVT_VMLINUX_BTF=/sys/kernel/btf/vmlinux generates it from a BTF
# file instead (what an architecture without a committed header does).
# Outputs live in the build tree, never in bpf/.

find_program(SVT_CLANG NAMES clang REQUIRED)
find_program(SVT_BPFTOOL NAMES bpftool PATHS /usr/sbin /usr/local/sbin REQUIRED)

set(SVT_VMLINUX_BTF "" CACHE FILEPATH "Generate vmlinux.h from this kernel BTF instead of the committed bpf/vmlinux/<arch>/vmlinux.h")
set(SVT_BPF_OUT "${CMAKE_BINARY_DIR}/bpf")
file(MAKE_DIRECTORY "${SVT_BPF_OUT}")

if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|amd64")
  set(SVT_BPF_ARCH x86)
elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64")
  set(SVT_BPF_ARCH arm64)
else()
  message(FATAL_ERROR "svctrace: unsupported architecture ${CMAKE_SYSTEM_PROCESSOR}")
endif()

set(SVT_COMMITTED_VMLINUX "${CMAKE_SOURCE_DIR}/bpf/vmlinux/${SVT_BPF_ARCH}/vmlinux.h")
if(NOT SVT_VMLINUX_BTF AND EXISTS "${SVT_COMMITTED_VMLINUX}")
  add_custom_command(
    OUTPUT "${SVT_BPF_OUT}/vmlinux.h"
    COMMAND ${CMAKE_COMMAND} -E copy "${SVT_COMMITTED_VMLINUX}" "${SVT_BPF_OUT}/vmlinux.h"
    DEPENDS "${SVT_COMMITTED_VMLINUX}"
    COMMENT "vmlinux.h: bpf/vmlinux/${SVT_BPF_ARCH}/vmlinux.h (a pinned kernel's BTF)"
    VERBATIM)
else()
  if(NOT SVT_VMLINUX_BTF)
    set(SVT_VMLINUX_BTF "/sys/kernel/btf/vmlinux")
  endif()
  if(NOT EXISTS "${SVT_VMLINUX_BTF}")
    message(FATAL_ERROR "svctrace: ${SVT_VMLINUX_BTF} not found: the kernel must be built with CONFIG_DEBUG_INFO_BTF=y")
  endif()
  add_custom_command(
    OUTPUT "${SVT_BPF_OUT}/vmlinux.h"
    COMMAND "${SVT_BPFTOOL}" btf dump file "${SVT_VMLINUX_BTF}" format c > "${SVT_BPF_OUT}/vmlinux.h.tmp"
    COMMAND ${CMAKE_COMMAND} -E rename "${SVT_BPF_OUT}/vmlinux.h.tmp" "${SVT_BPF_OUT}/vmlinux.h"
    COMMENT "Generating vmlinux.h from ${SVT_VMLINUX_BTF}"
    VERBATIM)
endif()

# svt_bpf_skeleton(<name> <source.bpf.c> [extra headers...])
# Defines target <name>_skel (INTERFACE) carrying the skeleton's include dir.
function(svt_bpf_skeleton name src)
  set(obj "${SVT_BPF_OUT}/${name}.bpf.o")
  set(skel "${SVT_BPF_OUT}/${name}.skel.h")
  add_custom_command(
    OUTPUT "${obj}"
    COMMAND "${SVT_CLANG}" -g -O2 -target bpf -D__TARGET_ARCH_${SVT_BPF_ARCH}
            -Wall -Werror -Wno-unused-function
            -I "${SVT_BPF_OUT}" -I "${CMAKE_SOURCE_DIR}/bpf"
            -c "${src}" -o "${obj}"
    DEPENDS "${src}" "${SVT_BPF_OUT}/vmlinux.h" ${ARGN}
    COMMENT "Compiling BPF object ${name}.bpf.o"
    VERBATIM)
  add_custom_command(
    OUTPUT "${skel}"
    COMMAND "${SVT_BPFTOOL}" gen skeleton "${obj}" name "${name}_bpf" > "${skel}.tmp"
    COMMAND ${CMAKE_COMMAND} -E rename "${skel}.tmp" "${skel}"
    DEPENDS "${obj}"
    COMMENT "Generating BPF skeleton ${name}.skel.h"
    VERBATIM)
  add_custom_target(${name}_skel_gen DEPENDS "${skel}")
  add_library(${name}_skel INTERFACE)
  add_dependencies(${name}_skel ${name}_skel_gen)
  target_include_directories(${name}_skel INTERFACE "${SVT_BPF_OUT}")
endfunction()
