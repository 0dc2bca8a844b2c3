# vspec - build, test, bench, demo.
#
#   make            build everything into build/
#   make test       build and run every test, once normally and once under ASan+UBSan, then
#                   a short fuzz pass; ends with "N passed, N failed, N skipped" (test cases)
#   make bench      CPU cost curve and decode throughput (not a test)
#   make demo       install deps, build, generate images with the shipped model
#                   (DAEMON=1: through vspecd and the vspec CLI)
#   make bench-daemon  the daemon's latency, preview and throughput figures
#   make bench-startup how long vspecd takes to answer, cold and warm cache
#   make bench-fleet   fleet mode: latency added by gateway + Redis, jobs/s, no job lost
#                   across a daemon, a gateway and a Redis SIGKILL (needs redis-server)
#   make fuzz       the libFuzzer targets of tests/fuzz/ (FUZZ_RUNS inputs each, default 1000000;
#                   clang only: skipped with a message without it), RSS growth bounded; make
#                   fuzz-check is the short pass make test runs
#   make soak       vspecd under ASan for SOAK_JOBS jobs (default 2000): failures, leaks, RSS
#                   growth bounded
#   make soak-http  vspecd's HTTP endpoint under ASan for SOAK_HTTP_JOBS jobs (default 2000),
#                   with clients that vanish, trickle or send malformed requests
#   make deps       install the Debian packages the project needs and OpenAI's Python SDK
#                   (into .venv, for the HTTP endpoint's test; idempotent)
#   make install    PREFIX=/usr/local DESTDIR=: programs, libvspec.so, plugins, headers,
#                   pkg-config files, models, vspecd.conf, the systemd unit; make uninstall
#   make gpu-test   the GPU suite on a CUDA device (reported as skipped without one)
#   make gpu-bundle build/gpu-bundle/: binaries, plugins and libraries for a GPU machine
#   VSPEC_CUDA=auto|0|1  build the CUDA module when nvcc is found / never / always
#
# Layout of the outputs:
#   build/libvspec.a                 core/ + kernels/cpu/ (engine, loaders, registry, ops)
#   build/lib/libvspec.so.X.Y.Z      the same objects as a shared library (SONAME libvspec.so.X)
#   build/dyn/                       the programs linked to it, as make install installs them
#   build/plugins/<kind>_<name>.so   plugins/<kind>/<name>.c or plugins/<kind>/<name>/*.c
#   build/vspec-bench                bench/
#   build/vspecd, build/vspec        vspecd/ (the program) on daemon/ (the job service), http/
#                                    (the HTTP front) and fleet/ (the fleet agent); clients/ (CLI)
#                                    on client/ (the connection); build/vspec-gateway fleet/
#   build/gen/proto/vspec.pb-c.[ch]  generated from proto/vspec.proto by protoc-c (never committed)
#   build/lib/libvspec-cuda.so       kernels/cuda/ (nvcc), loaded at run time for --device cuda
#   build/tests/test_*               tests/test_*.c (cmocka); build/tests/gpu/ the GPU suite
#   build/asan/...                   the same, built with -fsanitize=address,undefined
#   build/fuzz/...                   the same with clang and libFuzzer's instrumentation;
#                                    build/fuzz/targets/fuzz_* the fuzz targets (SAN=fuzz)

.DEFAULT_GOAL := all
BUILD ?= build
SAN ?= 0
CC ?= cc
FUZZ_CC ?= clang
PYTHON ?= /usr/bin/python3

# BLIS (the GEMMs of kernels/cpu/): through pkg-config when a blis.pc is installed (BLIS's
# own `make install` writes one; BLIS_PC names another), else Debian's libblis-pthread-dev,
# which ships none: its multiarch directories, asked of the compiler, not assumed x86_64.
BLIS_PC ?= blis
, := ,
ifeq ($(shell pkg-config --exists $(BLIS_PC) 2>/dev/null && echo y),y)
BLIS_CFLAGS := $(shell pkg-config --cflags $(BLIS_PC))
BLIS_LIB := $(patsubst -L%,%,$(filter -L%,$(shell pkg-config --libs-only-L $(BLIS_PC))))
BLIS_LIBS := $(shell pkg-config --libs $(BLIS_PC)) $(if $(BLIS_LIB),-Wl$(,)-rpath$(,)$(BLIS_LIB))
else
MULTIARCH := $(shell $(CC) -print-multiarch 2>/dev/null || dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null)
BLIS_INC ?= /usr/include/$(MULTIARCH)/blis-pthread
BLIS_LIB ?= /usr/lib/$(MULTIARCH)/blis-pthread
BLIS_CFLAGS := -I$(BLIS_INC)
BLIS_LIBS := -L$(BLIS_LIB) -Wl,-rpath,$(BLIS_LIB) -lblis
endif

ifeq ($(SAN),1)
BUILD := build/asan
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
OPT := -O1
else ifeq ($(SAN),fuzz)
# libFuzzer targets (tests/fuzz/): everything they reach carries the fuzzer's coverage
# instrumentation; only the targets link libFuzzer itself (-fsanitize=fuzzer).
BUILD := build/fuzz
override CC := $(FUZZ_CC)
SANFLAGS := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined \
            -fno-omit-frame-pointer
OPT := -O1
# clang knows no -Wformat-truncation
CFLAGS_EXTRA := -Wno-unknown-warning-option
else
OPT ?= -O2
endif

CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -g $(OPT) -Wall -Wextra -Werror -Wno-unused-parameter \
               -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-format-truncation \
               -fno-strict-aliasing $(CFLAGS_EXTRA)
CPPFLAGS := -Iinclude -I. $(BLIS_CFLAGS)
# LAPACK (dsyevd, for FID): Debian's reference LAPACK, linked statically from
# liblapacke-dev / liblapack-dev so that neither the liblapack.so.3 nor the libblas.so.3
# alternative (which may be OpenBLAS, or a second BLIS) gets loaded; its BLAS calls resolve
# to the BLIS above, hence -lblis again after it. libgfortran.so.5 is its Fortran runtime.
LDLIBS := $(BLIS_LIBS) -ljansson -lpng -lz -lsodium -ldl -lpthread -lm \
          -l:liblapacke.a -l:liblapack_pic.a -lblis -l:libgfortran.so.5

CFLAGS := $(CFLAGS_BASE) $(SANFLAGS) $(if $(SANFLAGS),-DVSPEC_SANITIZED)
# Each object's header dependencies, written by the compiler next to it (-MMD) and read back
# below; -MP keeps a deleted header from breaking the next build.
DEPFLAGS := -MMD -MP
# A tree built before objects recorded their header dependencies has objects that no changed
# header would rebuild (and, missing, would not rebuild either: .SECONDARY below): it is
# emptied once, the sanitizer and fuzz trees inside build/ apart (they have their own stamp).
ifeq ($(wildcard $(BUILD)/.deps-mmd),)
$(shell find $(BUILD) -mindepth 1 -maxdepth 1 ! -name asan ! -name fuzz -exec rm -rf {} + \
          2>/dev/null; mkdir -p $(BUILD) && touch $(BUILD)/.deps-mmd)
endif
LDFLAGS := $(SANFLAGS)
PLUGIN_CFLAGS := $(CFLAGS) -fPIC -fvisibility=hidden
PLUGIN_LDFLAGS := -shared $(SANFLAGS)

# ---- sources -------------------------------------------------------------------------
LIB_SRC := $(wildcard core/*.c kernels/*.c kernels/host/*.c kernels/cpu/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
LIB := $(BUILD)/libvspec.a
VERSION := $(shell sed -n 's/^\#define VSPEC_VERSION "\(.*\)"/\1/p' core/version.h)
SONAME := libvspec.so.$(firstword $(subst ., ,$(VERSION)))
SHARED_LIB := $(BUILD)/lib/libvspec.so.$(VERSION)

# single-file plugins: plugins/<kind>/<name>.c ; multi-file: plugins/<kind>/<name>/*.c
PLUGIN_FILES := $(wildcard plugins/*/*.c)
PLUGIN_DIRS := $(patsubst %/,%,$(sort $(dir $(wildcard plugins/*/*/*.c))))
plugin_so = $(BUILD)/plugins/$(word 2,$(subst /, ,$(1)))_$(basename $(notdir $(1))).so
PLUGINS := $(foreach f,$(PLUGIN_FILES),$(call plugin_so,$(f))) \
           $(foreach d,$(PLUGIN_DIRS),$(call plugin_so,$(d)))

# bench/ minus its main() is a library of its own: the eval / quality code is tested too.
# bench/daemon_*.c talk to vspecd (the generated protobuf header): programs of their own.
BENCH_SRC := $(filter-out bench/vspec_bench.c bench/daemon_%.c,$(wildcard bench/*.c))
BENCH_LIB := $(BUILD)/libvspecbench.a
BENCH := $(BUILD)/vspec-bench

# ---- the CUDA module (kernels/cuda/ -> $(BUILD)/lib/libvspec-cuda.so) --------------------
# VSPEC_CUDA=auto builds it when nvcc is found, 1 insists, 0 skips it. Binaries never link
# CUDA: kernels/device.c dlopens the module when a CUDA device is asked for, so a build or
# a machine without CUDA runs everything else. The sanitizer build leaves it out (the CPU
# code is what ASan checks here; the module runs only where there is a GPU).
VSPEC_CUDA ?= auto
NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
ifeq ($(VSPEC_CUDA),auto)
CUDA_ON := $(if $(NVCC),1,0)
else
CUDA_ON := $(VSPEC_CUDA)
endif
ifneq ($(SAN),0)
CUDA_ON := 0
endif
ifeq ($(CUDA_ON),1)
ifeq ($(NVCC),)
$(error VSPEC_CUDA=1 but nvcc was not found (put it on PATH or set NVCC=...))
endif
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_MODULE := $(BUILD)/lib/libvspec-cuda.so
CUDA_SRC := $(wildcard kernels/cuda/*.cu)
CUDA_OBJ := $(CUDA_SRC:%.cu=$(BUILD)/obj/%.o)
# Host math the module shares with libvspec, compiled again position-independent.
CUDA_HOST_OBJ := $(patsubst %.c,$(BUILD)/obj/pic/%.o,$(wildcard kernels/host/*.c))
# -lineinfo: source lines for Nsight Compute's stall samples (tools/gpu/kernels.sh), no cost at run
# time. sm_80 (A100), sm_89 (L4, RTX 40), sm_90 (H100/H200) and PTX for later GPUs. --fmad=false:
# the shared per-element math (kernels/common/) must round as it does on the CPU.
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_89,code=sm_89 \
             -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCCFLAGS := -std=c++17 -O2 -g -lineinfo --fmad=false $(CUDA_ARCH) -Iinclude -I. \
             -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Wno-unused-parameter,-Wno-format-truncation \
             -Werror all-warnings
CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -Xlinker -rpath -Xlinker '$$ORIGIN' \
               -Xlinker -rpath -Xlinker $(CUDA_HOME)/lib64 -lcublas -lcudart
CUDA_TARGETS := $(if $(filter 1,$(CUDA_ON)),$(CUDA_MODULE))

# ---- the service: wire protocol, daemon, gateway, CLI ------------------------------------
GEN_DIR := $(BUILD)/gen
PROTO_C := $(GEN_DIR)/proto/vspec.pb-c.c
PROTO_H := $(GEN_DIR)/proto/vspec.pb-c.h
# hiredis: the fleet queue on Redis Streams (fleet/fleet_queue*.c, DESIGN.md "Fleet mode").
# libmicrohttpd: the HTTP endpoint (http/http_server.c, DESIGN.md "HTTP endpoint").
SVC_LDLIBS := -lzmq -luv -lprotobuf-c -linih -lsodium -lhiredis -lmicrohttpd
WIRE_OBJ := $(BUILD)/obj/gen/proto/vspec.pb-c.o $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard proto/*.c))
DAEMON_MAINS := vspecd/vspecd.c fleet/gateway_main.c
# The service's layers (DESIGN.md "Layout"): daemon/ the job service; http/ and fleet/ above it.
SVC_DIRS := daemon http fleet
DAEMON_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(filter-out $(DAEMON_MAINS),$(wildcard $(SVC_DIRS:%=%/*.c))))
# The CLI: its main (the command table), the commands and their shared helpers (clients/cli.h).
CLIENT_MAINS := clients/vspec.c clients/cli_common.c $(wildcard clients/cmd_*.c)
CLI_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(CLIENT_MAINS))
CLIENT_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(filter-out $(CLIENT_MAINS),$(wildcard clients/*.c)))
# The client library (client/): the connection to vspecd or a gateway that the CLI, the
# gateway, the fleet agent, the HTTP front and the daemon benches share.
CONN_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard client/*.c))
SVC_LIB := $(BUILD)/libvspecsvc.a
VSPECD := $(BUILD)/vspecd
VSPEC_CLI := $(BUILD)/vspec
GATEWAY := $(BUILD)/vspec-gateway
DAEMON_BENCH := $(BUILD)/vspecd-bench
DAEMON_SOAK := $(BUILD)/vspecd-soak
DAEMON_HTTP_SOAK := $(BUILD)/vspecd-http-soak
DAEMON_STARTUP := $(BUILD)/vspecd-startup-bench
DAEMON_FLEET_BENCH := $(BUILD)/vspecd-fleet-bench
DAEMON_PROC_OBJ := $(BUILD)/obj/bench/daemon_proc.o
# vspecd-fleet-bench's own parts: its fleet of processes, the load, its redis-server.
DAEMON_FLEET_OBJ := $(patsubst %,$(BUILD)/obj/bench/daemon_%.o,fleet fleet_load redis)
SERVICE := $(VSPECD) $(VSPEC_CLI) $(GATEWAY) $(DAEMON_BENCH) $(DAEMON_SOAK) \
           $(DAEMON_HTTP_SOAK) $(DAEMON_STARTUP) \
           $(DAEMON_FLEET_BENCH)

TEST_SRC := $(wildcard tests/test_*.c)
TESTS := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# The GPU suite: built by make all, run by make gpu-test (skipped without a CUDA device)
GPU_TEST_SRC := $(wildcard tests/gpu/test_*.c)
GPU_TESTS := $(GPU_TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# ... by make all, but not in the sanitizer and fuzz trees: they have no CUDA module, so the
# suite could only skip there (make gpu-test still builds it on request).
GPU_TESTS_ALL := $(if $(filter 0,$(SAN)),$(GPU_TESTS))
TEST_SUPPORT_SRC := $(wildcard tests/support/*.c)
TEST_SUPPORT_OBJ := $(TEST_SUPPORT_SRC:%.c=$(BUILD)/obj/%.o)
# test plugins: built by tests/plugins/plugins.mk
include tests/plugins/plugins.mk

# Every header: the CUDA objects depend on all of them (nvcc writes no .d files here).
HEADERS := $(wildcard include/vspec/*.h core/*.h kernels/*.h kernels/common/*.h kernels/host/*.h kernels/cpu/*.h \
                     bench/*.h tests/support/*.h tests/gpu/*.h tests/fuzz/*.h)

# libFuzzer targets: tests/fuzz/fuzz_<name>.c -> $(BUILD)/targets/fuzz_<name> (SAN=fuzz only),
# and the program that writes the request target's seeds.
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_TARGETS := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/targets/%)
FUZZ_RUNS ?= 1000000
FUZZ_TIME ?= 3600
FUZZ_CHECK_TIME ?= 4
# make fuzz fails when a target's RSS grows more than this after the warm-up (issue 32,
# finding 8), under an ASan quarantine of FUZZ_QUARANTINE_MB.
FUZZ_RSS_BOUND_MB ?= 8
FUZZ_QUARANTINE_MB ?= 4

.PHONY: install uninstall install-check all test check bench bench-daemon bench-startup bench-fleet demo deps clean train gpu-test gpu-bundle \
        fuzz fuzz-check fuzz-seeds fuzz-targets soak soak-http soak-build
# Objects reached through pattern chains are kept: no rebuild of every test on each run.
.SECONDARY:
all: $(LIB) $(BENCH_LIB) $(PLUGINS) $(BENCH) $(TEST_PLUGINS) $(SERVICE) $(CUDA_TARGETS) \
     $(GPU_TESTS_ALL)

# The CUDA module (variables above).
$(BUILD)/obj/kernels/cuda/%.o: kernels/cuda/%.cu $(wildcard kernels/cuda/*.h) $(HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
$(BUILD)/obj/pic/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(DEPFLAGS) -fPIC -fvisibility=hidden -c $< -o $@
$(CUDA_MODULE): $(CUDA_OBJ) $(CUDA_HOST_OBJ)
	@mkdir -p $(dir $@)
	$(NVCC) -shared $(CUDA_ARCH) $^ -o $@ -Xlinker --no-undefined $(CUDA_LDLIBS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

# Generated protobuf-c code: regenerated at build time, never committed (the generated header
# checks the protobuf-c runtime version it was made for, so it must come from this machine's).
# One run makes both files: a grouped target, so that make knows the header changed too (with
# the header as a recipe-less target of the .c, objects that include it were sometimes judged
# up to date against the old header after a .proto change: a stale Submit in the ASan tests).
$(PROTO_C) $(PROTO_H) &: proto/vspec.proto
	@mkdir -p $(GEN_DIR)
	protoc-c --c_out=$(GEN_DIR) $<
$(BUILD)/obj/gen/%.o: $(GEN_DIR)/%.c $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -I$(GEN_DIR) $(CFLAGS) $(DEPFLAGS) -c $< -o $@
# Everything that includes the generated header (the service and the tests): it must exist
# before their first compilation (order-only); after that their .d files name it.
define SVC_OBJ_RULE
$(BUILD)/obj/$(1)/%.o: $(1)/%.c | $$(PROTO_H)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CPPFLAGS) -I$$(GEN_DIR) $$(CFLAGS) $$(DEPFLAGS) -c $$< -o $$@
endef
$(foreach d,proto $(SVC_DIRS) vspecd client clients tests,$(eval $(call SVC_OBJ_RULE,$(d))))

$(SVC_LIB): $(DAEMON_OBJ) $(CONN_OBJ) $(CLIENT_OBJ) $(WIRE_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^
$(VSPECD): $(BUILD)/obj/vspecd/vspecd.o $(SVC_LIB) $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(SVC_LDLIBS) $(LDLIBS)
$(GATEWAY): $(BUILD)/obj/fleet/gateway_main.o $(SVC_LIB) $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(SVC_LDLIBS) $(LDLIBS)
$(VSPEC_CLI): $(CLI_OBJ) $(SVC_LIB) $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(SVC_LDLIBS) $(LDLIBS)
$(DAEMON_BENCH): $(patsubst %,$(BUILD)/obj/bench/daemon_%.o,bench batch jobs) $(DAEMON_PROC_OBJ) $(SVC_LIB) $(BENCH_LIB) $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(SVC_LDLIBS) $(LDLIBS)
$(DAEMON_SOAK): $(BUILD)/obj/bench/daemon_soak.o $(DAEMON_PROC_OBJ) $(SVC_LIB) $(BENCH_LIB) $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(SVC_LDLIBS) $(LDLIBS)
$(DAEMON_HTTP_SOAK): $(BUILD)/obj/bench/daemon_http_soak.o $(DAEMON_PROC_OBJ) $(SVC_LIB) $(BENCH_LIB) $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(SVC_LDLIBS) $(LDLIBS)
$(DAEMON_STARTUP): $(BUILD)/obj/bench/daemon_startup.o $(DAEMON_PROC_OBJ) $(SVC_LIB) $(BENCH_LIB) $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(SVC_LDLIBS) $(LDLIBS)
$(DAEMON_FLEET_BENCH): $(BUILD)/obj/bench/daemon_fleet_bench.o $(DAEMON_FLEET_OBJ) $(DAEMON_PROC_OBJ) \
                       $(SVC_LIB) $(BENCH_LIB) $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(SVC_LDLIBS) $(LDLIBS)
$(BUILD)/obj/bench/daemon_%.o: bench/daemon_%.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -I$(GEN_DIR) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# The same objects make the shared library `make install` installs (SONAME libvspec.so.N):
# they are compiled position-independent for it; -fno-semantic-interposition keeps GCC
# inlining and calling the library's own functions directly, as in the static library.
$(LIB_OBJ): CFLAGS += -fPIC -fno-semantic-interposition
# Under ASan+UBSan the CPU kernels (kernels/cpu/) are compiled -O2, still instrumented: at -O1
# their intrinsic micro-kernels spill every accumulator and the model tests ran 20 times
# slower than the plain build's (test_walk_jobs: 40 s of make test's ASan pass, 17 s at -O2);
# every load and store is checked all the same. The rest of the tree keeps -O1.
ifeq ($(SAN),1)
$(BUILD)/obj/kernels/cpu/%.o: CFLAGS += -O2
endif
$(SHARED_LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared $(LDFLAGS) -Wl,-soname,$(SONAME) -Wl,--no-undefined $^ -o $@ $(LDLIBS)
	ln -sf $(notdir $@) $(BUILD)/lib/$(SONAME)
	ln -sf $(SONAME) $(BUILD)/lib/libvspec.so

# Plugins compile against include/ only: they must not need the host's internals. The
# registry refuses a plugin directory or file that its group or others can write, so both
# are made go-w whatever the umask (DESIGN.md, "Plugin loading rules").
define PLUGIN_FILE_RULE
$(call plugin_so,$(1)): $(1) $(wildcard $(dir $(1))*.h include/vspec/*.h kernels/common/*.h)
	@mkdir -p $$(dir $$@) && chmod go-w $$(dir $$@)
	$$(CC) -Iinclude -Ikernels $$(PLUGIN_CFLAGS) $$< -o $$@ $$(PLUGIN_LDFLAGS) -lm
	@chmod go-w $$@
endef
$(foreach f,$(PLUGIN_FILES),$(eval $(call PLUGIN_FILE_RULE,$(f))))

define PLUGIN_DIR_RULE
$(call plugin_so,$(1)): $(wildcard $(1)/*.c $(1)/*.h) $(wildcard include/vspec/*.h kernels/common/*.h)
	@mkdir -p $$(dir $$@) && chmod go-w $$(dir $$@)
	$$(CC) -Iinclude -Ikernels $$(PLUGIN_CFLAGS) $(wildcard $(1)/*.c) -o $$@ $$(PLUGIN_LDFLAGS) -lm
	@chmod go-w $$@
endef
$(foreach d,$(PLUGIN_DIRS),$(eval $(call PLUGIN_DIR_RULE,$(d))))

$(BENCH_LIB): $(BENCH_SRC:%.c=$(BUILD)/obj/%.o)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BENCH): $(BUILD)/obj/bench/vspec_bench.o $(BENCH_LIB) $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TEST_SUPPORT_OBJ) $(SVC_LIB) $(BENCH_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(SVC_LDLIBS) $(LDLIBS) -lcmocka

$(BUILD)/targets/fuzz_%: $(BUILD)/obj/tests/fuzz/fuzz_%.o $(SVC_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -fsanitize=fuzzer $^ -o $@ $(SVC_LDLIBS) $(LDLIBS)
$(BUILD)/targets/request_seeds: $(BUILD)/obj/tests/fuzz/request_seeds.o $(SVC_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(SVC_LDLIBS)
fuzz-targets: $(FUZZ_TARGETS) $(BUILD)/targets/request_seeds $(PLUGINS)

# Runs every test binary from the repository root; VSPEC_BUILD tells tests where the
# plugins are. A failing test fails the target but the rest still run. Each runs through
# tests/tally.sh, which shows its output and adds its counts of test cases to
# $(BUILD)/tests/results.txt, for make test's closing line.
# The statistical tests are long, single-threaded and talk to no daemon: they run one after
# the other beside the other tests that start no daemon either, which keeps the second core
# busy; their output is printed when they are done. The tests that run daemons come after:
# their timings (a submit racing a client's disconnect, drains) are not for a loaded machine.
# The two lanes are balanced (2 cores): in the plain build test_sd_exact (30 s) runs in the
# first one, else the statistical lane alone would take 91 s of the 137 s; under the
# sanitizers the statistical tests take fewer samples and the model tests are the slow ones,
# so test_walk_jobs (17 s, one process, its own cache directory) joins the statistical lane.
ifeq ($(SAN),0)
BESIDE_TESTS := $(filter %/test_cspd_exact %/test_sd_relaxed,$(TESTS))
else
BESIDE_TESTS := $(filter %/test_cspd_exact %/test_sd_exact %/test_sd_relaxed %/test_walk_jobs,$(TESTS))
endif
DAEMON_TESTS := $(foreach t,$(shell grep -l 'daemon_harness\|vs_daemon_start\|vspecd' \
                  tests/test_*.c),$(BUILD)/tests/$(basename $(notdir $(t))))
TALLY := tests/tally.sh
check: all $(TESTS)
	@fail=0; beside=$(BUILD)/tests/beside.log; res=$(BUILD)/tests/results.txt; rm -f $$res; \
	( bf=0; for t in $(BESIDE_TESTS); do \
	    echo "== $$t (beside the others)"; \
	    VSPEC_BUILD=$(BUILD) $(TALLY) run $$res $$t ./$$t || { echo "FAILED: $$t"; bf=1; }; \
	  done; exit $$bf ) > $$beside 2>&1 & bpid=$$!; \
	for t in $(filter-out $(BESIDE_TESTS) $(DAEMON_TESTS),$(TESTS)) -- $(DAEMON_TESTS); do \
	  if [ "$$t" = -- ]; then wait $$bpid || fail=1; cat $$beside; continue; fi; \
	  echo "== $$t"; \
	  VSPEC_BUILD=$(BUILD) $(TALLY) run $$res $$t ./$$t || { echo "FAILED: $$t"; fail=1; }; \
	done; \
	if [ "$(SAN)" = 0 ]; then \
	  $(TALLY) run $$res install-check $(MAKE) --no-print-directory install-check || fail=1; \
	  $(TALLY) run $$res python-check $(MAKE) --no-print-directory python-check || fail=1; \
	  $(TALLY) run $$res layout-check ./tools/check_layout.py || fail=1; \
	fi; \
	exit $$fail

# make install into a temporary DESTDIR and use the result (tests/install/test_install.sh).
# (The make the script runs works alone, as before make test gave -j: no jobserver for it.)
install-check: all $(SHARED_LIB) $(DYN_PROGS)
	MAKEFLAGS="$(filter-out -j% --jobserver%,$(MAKEFLAGS))" tests/install/test_install.sh $(BUILD)

# The Python client (clients/python): the package with the protobuf module protoc generates
# (never committed) in $(BUILD)/python/vspec, and its test against a real vspecd on the
# shipped model (tests/python/test_client.py), run by make check after the C tests.
PY_PKG := $(BUILD)/python/vspec
PY_SRC := $(wildcard clients/python/vspec/*.py)
.PHONY: python-client python-check
$(PY_PKG)/vspec_pb2.py: proto/vspec.proto $(PY_SRC)
	@mkdir -p $(PY_PKG)
	cp $(PY_SRC) $(PY_PKG)/
	protoc -Iproto --python_out=$(PY_PKG) proto/vspec.proto
python-client: $(PY_PKG)/vspec_pb2.py
# tests/python/test_openai.py drives the HTTP endpoint with OpenAI's SDK, which make deps
# installs into the repository's .venv (tools/install_deps.sh); without it the test says so
# and skips. Both run even when the first fails.
OPENAI_PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,$(PYTHON))
python-check: all $(PY_PKG)/vspec_pb2.py
	@st=0; \
	VSPEC_BUILD=$(BUILD) PYTHONPATH=$(BUILD)/python $(PYTHON) tests/python/test_client.py || st=1; \
	VSPEC_BUILD=$(BUILD) $(OPENAI_PYTHON) tests/python/test_openai.py || st=1; \
	$(PYTHON) tests/python/test_kernel_table.py || st=1; \
	exit $$st

# make test ends with one line, "N passed, N failed, N skipped" (tests/tally.sh): test
# cases, over the plain run, the ASan run and the fuzz pass. A cmocka case that called skip()
# (no AMX, no redis-server, smaller under the sanitizers) is skipped; the install test is one
# case, each fuzz target one (all skipped without clang). As before, the first of the three
# runs that fails ends make test with exit status 1; a failure no case shows (a build error)
# counts as one failed case.
# The three trees are built with one job per core (TEST_JOBS) unless make test was given -j:
# a clean clone (CI) otherwise compiles them on one core of its two (the tests themselves run
# as make check orders them, whatever -j says).
TEST_TALLIES := build/tests/results.txt build/asan/tests/results.txt build/fuzz/results.txt
TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
TEST_J = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(TEST_JOBS))
test:
	@rm -f $(TEST_TALLIES); st=0; \
	{ $(MAKE) $(TEST_J) check && $(MAKE) $(TEST_J) check SAN=1 && \
	  $(MAKE) $(TEST_J) fuzz-check; } || st=1; \
	$(TALLY) summary $$st $(TEST_TALLIES); exit $$st

# Fuzzing (tests/fuzz/run.sh; docs/RELIABILITY.md, "Fuzzing"): make fuzz runs each target for
# FUZZ_RUNS inputs (at most FUZZ_TIME seconds) and holds each one's RSS growth after the
# warm-up (the first tenth) to FUZZ_RSS_BOUND_MB, make fuzz-check replays the seed corpus and the
# regression inputs and fuzzes FUZZ_CHECK_TIME seconds per target, make fuzz-seeds rewrites
# the request target's seeds. Without clang and libFuzzer each says so and succeeds.
# make fuzz-check counts its targets in build/fuzz/results.txt for make test's closing line.
FUZZ_RESULTS := build/fuzz/results.txt
fuzz fuzz-check fuzz-seeds:
	@$(if $(filter fuzz-check,$@),rm -f $(FUZZ_RESULTS);) \
	if FUZZ_CC="$(FUZZ_CC)" tests/fuzz/run.sh probe; then \
	  $(MAKE) --no-print-directory SAN=fuzz fuzz-targets && \
	  FUZZ_RUNS=$(FUZZ_RUNS) FUZZ_TIME=$(FUZZ_TIME) FUZZ_CHECK_TIME=$(FUZZ_CHECK_TIME) \
	  FUZZ_RSS_BOUND_MB=$(FUZZ_RSS_BOUND_MB) FUZZ_QUARANTINE_MB=$(FUZZ_QUARANTINE_MB) \
	    $(if $(filter fuzz-check,$@),$(TALLY) run $(FUZZ_RESULTS) fuzz-check) \
	    tests/fuzz/run.sh $(if $(filter fuzz,$@),run,$(@:fuzz-%=%)) build/fuzz; \
	$(if $(filter fuzz-check,$@),else $(TALLY) skip $(FUZZ_RESULTS) $(words $(FUZZ_SRC)) fuzz-check;) \
	fi

# The GPU suite (tests/gpu/ and the golden tests on cuda); every test reports "skipped"
# where no CUDA device can be used. VSPEC_TEST_DEVICE=cuda:N picks another GPU.
gpu-test: all $(TESTS) $(GPU_TESTS)
	./tools/gpu/run_gpu_tests.sh $(BUILD)

# A copy of what the GPU suite and the GPU benchmarks need, with the Debian libraries they
# load, for a machine that has a GPU but not this build's packages (tools/gpu/bundle.sh).
gpu-bundle: all $(TESTS) $(GPU_TESTS)
	./tools/gpu/bundle.sh $(BUILD) $(BUILD)/gpu-bundle

bench: all
	./$(BENCH) costcurve --model tests/golden/micro_c2i --label micro
	./$(BENCH) costcurve --random gpt-b --label "random GPT-B shape"

# make demo DAEMON=1: the same through vspecd and the vspec CLI (tools/demo_daemon.sh).
demo: deps all
ifeq ($(DAEMON),1)
	./tools/demo_daemon.sh $(BUILD)
else
	./$(BENCH) demo
endif

# The daemon's cost over in-process generation: latency, previews, throughput (vspecd-bench
# starts its own daemon). On the micro test model unless models/fmnist exists, and on a
# synthetic heavier model.
bench-daemon: all
	./$(DAEMON_BENCH)
	./$(DAEMON_BENCH) --synthetic 8,256,8 --images 10

# vspecd's start (docs/BENCHMARKS.md, "Daemon start"): fork to the first answered ping, cold
# and warm cache, on models/fmnist and on a random GPT-B/VQ-16-shaped model written (once,
# 600 MB) into STARTUP_MODEL_DIR.
STARTUP_MODEL_DIR ?= /tmp/vspec-random-gptb
bench-startup: all
	./$(DAEMON_STARTUP) --runs 5 --model models/fmnist --random-gptb $(STARTUP_MODEL_DIR)

# Fleet mode (docs/BENCHMARKS.md, "Fleet mode"): vspecd-fleet-bench starts its own
# redis-server, 3 vspecd in fleet mode and 2 vspec-gateway; the latency the queue adds to an
# image of the shipped model against a direct vspecd, then jobs/s calm and while a daemon, a
# gateway and Redis are SIGKILLed; fails if a job is lost, duplicated or failed.
bench-fleet: all
	./$(DAEMON_FLEET_BENCH)

# A long mixed load on the ASan vspecd (bench/daemon_soak.c; docs/RELIABILITY.md, "Soak"):
# SOAK_JOBS jobs from 8 clients, 100 reloads of the acceptance rule, clients that vanish,
# previews without credit; reports failures, leaks at exit, RSS over the run, latency; fails
# when RSS grows more than 8 MB after the warm-up (--rss-bound-mb). Not part of make test.
# SOAK_ARGS passes more options (build/asan/vspecd-soak --help).
SOAK_JOBS ?= 2000
SOAK_ARGS ?=
soak:
	$(MAKE) --no-print-directory SAN=1 soak-build
	./build/asan/vspecd-soak --jobs $(SOAK_JOBS) $(SOAK_ARGS)
soak-build: $(VSPECD) $(DAEMON_SOAK) $(DAEMON_HTTP_SOAK) $(PLUGINS)

# The HTTP endpoint under the same kind of load (bench/daemon_http_soak.c; docs/RELIABILITY.md,
# "HTTP soak"): SOAK_HTTP_JOBS legitimate jobs (raw sockets, curl, trickled within the
# deadline) mixed with clients that abandon their jobs, malformed requests (each must get a
# 4xx) and connections trickling past the request deadline; 0 failed jobs, RSS growth after
# the warm-up within 8 MB, no leak. Not part of make test. SOAK_HTTP_ARGS passes more options.
SOAK_HTTP_JOBS ?= 2000
SOAK_HTTP_ARGS ?=
soak-http:
	$(MAKE) --no-print-directory SAN=1 soak-build
	./build/asan/vspecd-http-soak --jobs $(SOAK_HTTP_JOBS) $(SOAK_HTTP_ARGS)

# Retrains the Fashion-MNIST model family into models/fmnist/ (hours on 2 cores; resumable,
# logs in tools/train/work/logs/). Needs python3-torch (make deps installs it).
train:
	./tools/train/train_all.sh

# ---- install: a system package's layout (docs/DESIGN.md "Installed layout") ---------------
# make install PREFIX=/usr/local DESTDIR=/tmp/stage: the programs (linked to the shared
# libvspec, found through their RUNPATH $ORIGIN/../lib), libvspec.so with its SONAME, the CUDA
# module when built, the plugins in LIBDIR/vspec/plugins, the plugin headers and pkg-config
# files (pkg-config --cflags vspec-plugin), the shipped models, vspecd.conf and the systemd
# unit with this layout's paths, vspec's shell completion for bash
# (DATADIR/bash-completion/completions/vspec) and zsh (DATADIR/zsh/site-functions/_vspec)
# (tools/install.sh). make uninstall removes the same files.
PREFIX ?= /usr/local
DESTDIR ?=
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
DATADIR ?= $(PREFIX)/share
SYSCONFDIR ?= $(if $(filter /usr,$(PREFIX)),/etc,$(PREFIX)/etc)
UNITDIR ?= $(PREFIX)/lib/systemd/system
DYN_DIR := $(BUILD)/dyn
DYN_PROGS := $(addprefix $(DYN_DIR)/,vspecd vspec vspec-gateway vspec-bench)
DYN_LINK = $(CC) $(LDFLAGS) $(filter %.o %.a,$^) -o $@ -L$(BUILD)/lib -lvspec \
           -Wl,-rpath,'$$ORIGIN/../lib' $(SVC_LDLIBS) $(LDLIBS)
$(DYN_DIR)/vspecd: $(BUILD)/obj/vspecd/vspecd.o $(SVC_LIB) $(SHARED_LIB)
	@mkdir -p $(dir $@)
	$(DYN_LINK)
$(DYN_DIR)/vspec: $(CLI_OBJ) $(SVC_LIB) $(SHARED_LIB)
	@mkdir -p $(dir $@)
	$(DYN_LINK)
$(DYN_DIR)/vspec-gateway: $(BUILD)/obj/fleet/gateway_main.o $(SVC_LIB) $(SHARED_LIB)
	@mkdir -p $(dir $@)
	$(DYN_LINK)
$(DYN_DIR)/vspec-bench: $(BUILD)/obj/bench/vspec_bench.o $(BENCH_LIB) $(SHARED_LIB)
	@mkdir -p $(dir $@)
	$(DYN_LINK)
INSTALL_ENV = BUILD="$(BUILD)" DESTDIR="$(DESTDIR)" PREFIX="$(PREFIX)" BINDIR="$(BINDIR)" \
              LIBDIR="$(LIBDIR)" INCLUDEDIR="$(INCLUDEDIR)" DATADIR="$(DATADIR)" \
              SYSCONFDIR="$(SYSCONFDIR)" UNITDIR="$(UNITDIR)" VERSION="$(VERSION)" \
              SONAME="$(SONAME)"
install: all $(SHARED_LIB) $(DYN_PROGS)
	$(INSTALL_ENV) ./tools/install.sh install
uninstall:
	$(INSTALL_ENV) ./tools/install.sh uninstall

deps:
	./tools/install_deps.sh

clean:
	rm -rf build

# The header dependencies the compiler recorded (see DEPFLAGS).
-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
