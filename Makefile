# qshard Makefile
#
# How flags compose: CFLAGS_BASE (language, warnings, includes) + OPT (optimisation) + SAN
# (sanitizers, set by `make check`) + EXTRA_CFLAGS (yours). Dependencies come from pkg-config
# (libcjson, libxxhash, zlib) and CUDA_HOME (nvcc, cuBLAS, NCCL). Everything goes to $(BUILD)/,
# flat: file names are unique across the tree. `make help` lists the targets.
#
# Host code: C11, gcc, -Wall -Wextra clean (-Werror with WERROR=1, as CI does).
# Kernels: nvcc, real code for sm_80, sm_89, sm_90a plus PTX. Without nvcc the CPU parts still
# build and test; the CUDA backend is replaced by a stub that says so at run time.

CC         ?= gcc
CUDA_HOME  ?= /usr/local/cuda
NVCC       ?= $(CUDA_HOME)/bin/nvcc
BUILD      ?= build
PKG_CONFIG ?= pkg-config
DEBUG      ?= 0
DEBUG_SYNC ?= 0
WERROR     ?= 0
V          ?= 0
# NO_CUDA=1 forces a CPU-only build even where nvcc exists.
NO_CUDA    ?= 0

ifeq ($(filter $(DEBUG),0 1),)
$(error DEBUG must be 0 or 1, got '$(DEBUG)')
endif
ifeq ($(filter $(NO_CUDA),0 1),)
$(error NO_CUDA must be 0 or 1, got '$(NO_CUDA)')
endif

Q := @
ifeq ($(V),1)
Q :=
endif

# --- dependencies --------------------------------------------------------------------------
# PREBUILT=1 (test-gpu, bench-gpu): run binaries built elsewhere and carried in $(BUILD)/, on a
# machine without the -dev packages (the GPU machine); nothing is compiled then.
PREBUILT ?= 0
PKGS := libcjson libxxhash zlib libmicrohttpd libcurl
ifeq ($(PREBUILT),0)
ifneq ($(shell $(PKG_CONFIG) --exists $(PKGS) && echo ok),ok)
$(error missing libraries: install them with `apt-get install -y libcjson-dev libxxhash-dev zlib1g-dev libmicrohttpd-dev libcurl4-openssl-dev pkg-config` (see README))
endif
endif
DEP_CFLAGS := $(shell $(PKG_CONFIG) --cflags $(PKGS) 2>/dev/null)
# xxHash is linked statically so binaries carried to the GPU machine need only libcjson.so.1,
# which is copied next to them (rpath $ORIGIN).
DEP_LIBS   := -lcjson -l:libxxhash.a -lz -lpthread -lm
# the server (qshard serve: libmicrohttpd) and its benchmark client (qshard bench serve: libcurl)
# only in the qshard binary
SERVE_LIBS := -lmicrohttpd -lcurl

HAVE_CUDA := 0
ifeq ($(NO_CUDA),0)
ifneq ($(wildcard $(NVCC)),)
HAVE_CUDA := 1
endif
endif
ifeq ($(HAVE_CUDA),1)
CUDA_STATE := ON ($(NVCC))
else ifeq ($(NO_CUDA),1)
CUDA_STATE := OFF (NO_CUDA=1: CPU-only build, CUDA backend and GPU tests skipped)
else
CUDA_STATE := OFF (no nvcc at $(NVCC); set CUDA_HOME: CPU-only build, CUDA backend and GPU tests skipped)
endif
# MPI (one process per rank, runtime/rt_comm_mpi.c): OpenMPI's pkg-config file, else mpicc's
# flags; NO_MPI=1 builds without it (runtime/rt_comm_mpi_nompi.c says so at run time).
NO_MPI ?= 0
HAVE_MPI := 0
ifeq ($(NO_MPI),0)
ifeq ($(shell $(PKG_CONFIG) --exists ompi-c 2>/dev/null && echo ok),ok)
HAVE_MPI := 1
MPI_CFLAGS := $(shell $(PKG_CONFIG) --cflags ompi-c)
MPI_LIBS := $(shell $(PKG_CONFIG) --libs ompi-c)
else ifneq ($(shell command -v mpicc 2>/dev/null),)
HAVE_MPI := 1
MPI_CFLAGS := $(shell mpicc --showme:compile)
MPI_LIBS := $(shell mpicc --showme:link)
endif
endif
ifeq ($(HAVE_MPI),1)
MPI_STATE := ON (mpirun -np N qshard run|logits|perplexity|serve)
else
MPI_STATE := OFF (no libopenmpi-dev: one process drives every rank; mpirun refused)
endif
# Say once, at the top-level make, which backends this build has.
ifeq ($(MAKELEVEL),0)
ifeq ($(filter help clean,$(MAKECMDGOALS)),)
$(info qshard: CUDA backend $(CUDA_STATE))
$(info qshard: MPI $(MPI_STATE))
endif
endif

# --- flags ---------------------------------------------------------------------------------
# Per-module include paths enforce docs/DESIGN.md section 1 (who includes what): an object
# compiles with only the directories its module may use, so a library file that includes a
# tools/ header (cmd.h, cli.h) fails to build. convert/ gets runtime/ for rt_tok.h (the
# converter's tokenizer checks) and nothing else there (`make lint` checks that).
# kernels/k_bench.cu (`qshard bench kernel`) also reads runtime/rt_sample.h (its host
# reference) until that bench moves.
INC_format  := -Iformat
INC_kernels := -Iformat -Ikernels
INC_convert := -Iformat -Ikernels -Iconvert -Iruntime
INC_runtime := -Iformat -Ikernels -Iruntime
INC_all     := -Iformat -Ikernels -Iconvert -Iruntime -Itools -Itools/serve
INCLUDES    := $(INC_all)
CFLAGS_BASE  = -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wshadow -Wstrict-prototypes \
               -Wpointer-arith -Wundef -Wcast-align -g -MMD -MP $(INCLUDES) $(DEP_CFLAGS)
ifeq ($(DEBUG),1)
OPT ?= -O0
else
OPT ?= -O2 -march=x86-64-v2
endif
ifeq ($(WERROR),1)
CFLAGS_BASE += -Werror
endif
SAN ?=
ALL_CFLAGS = $(CFLAGS_BASE) $(OPT) $(SAN) $(EXTRA_CFLAGS)
LDFLAGS_ALL = $(SAN) -Wl,-rpath,'$$ORIGIN' $(LDFLAGS)

CUDA_ARCHS  ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_89,code=sm_89 \
               -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90
NVCCFLAGS   ?= -std=c++17 -O3 -lineinfo $(CUDA_ARCHS) -Xcompiler -Wall,-Wextra \
               -DK_DEBUG_SYNC=$(DEBUG_SYNC) -MMD -MP
# cuBLAS is not linked: kernels/k_cublas_load.cu dlopens it on first use (it costs ~150 MB of
# RSS at program start, which the converter cannot afford under its 512 MiB bound).
CUDA_LIBS   := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lnccl -ldl -lstdc++

# --- sources -------------------------------------------------------------------------------
# Library: every .c in format/ convert/ convert/arch/ runtime/ kernels/ (fuzz targets live in
# tests/).
# A file X_nocuda.c stands in for X.cu (same directory) when there is no nvcc, or when X.cu
# does not exist yet.
LIB_C_ALL := $(wildcard format/*.c convert/*.c convert/arch/*.c runtime/*.c kernels/*.c)
CU_SRC    := $(wildcard kernels/*.cu runtime/*.cu)
NOCUDA_C  := $(filter %_nocuda.c,$(LIB_C_ALL))
ifeq ($(HAVE_CUDA),1)
NOCUDA_REPLACED := $(foreach f,$(NOCUDA_C),$(if $(wildcard $(f:_nocuda.c=.cu)),$(f)))
LIB_C     := $(filter-out $(NOCUDA_REPLACED),$(LIB_C_ALL))
LIB_CU    := $(CU_SRC)
else
LIB_C     := $(LIB_C_ALL)
LIB_CU    :=
endif
# X_nompi.c stands in for X.c without MPI (and X.c is left out)
ifeq ($(HAVE_MPI),1)
LIB_C     := $(filter-out %_nompi.c,$(LIB_C))
else
LIB_C     := $(filter-out $(patsubst %_nompi.c,%.c,$(filter %_nompi.c,$(LIB_C))),$(LIB_C))
endif
TOOL_C    := $(wildcard tools/*.c tools/serve/*.c)
TEST_C    := $(wildcard tests/test_*.c)
FUZZ_C    := $(wildcard tests/fuzz_*.c)
GPU_TEST_CU := $(wildcard tests/gpu_test_*.cu)
# kernels/lab/: standalone experiment programs (`make lab`), not part of libqshard.a
LAB_CU    := $(wildcard kernels/lab/*.cu)

LIB_OBJ   := $(patsubst %.c,$(BUILD)/%.o,$(notdir $(LIB_C))) \
             $(patsubst %.cu,$(BUILD)/%.cu.o,$(notdir $(LIB_CU)))
TOOL_OBJ  := $(patsubst %.c,$(BUILD)/%.o,$(notdir $(TOOL_C)))
TEST_BIN  := $(patsubst tests/%.c,$(BUILD)/%,$(TEST_C))
GPU_TEST_BIN := $(patsubst tests/%.cu,$(BUILD)/%,$(GPU_TEST_CU))
LAB_BIN   := $(patsubst kernels/lab/%.cu,$(BUILD)/lab/%,$(LAB_CU))
LIBQS     := $(BUILD)/libqshard.a

# the include paths of each module's objects (target-specific: see INC_* above)
obj_of = $(patsubst %.c,$(BUILD)/%.o,$(notdir $(filter $(1)/%.c,$(LIB_C)))) \
         $(patsubst %.cu,$(BUILD)/%.cu.o,$(notdir $(filter $(1)/%.cu,$(LIB_CU))))
$(call obj_of,format):  INCLUDES := $(INC_format)
$(call obj_of,kernels): INCLUDES := $(INC_kernels)
$(call obj_of,convert): INCLUDES := $(INC_convert)
$(call obj_of,runtime): INCLUDES := $(INC_runtime)
$(BUILD)/k_bench.cu.o:  INCLUDES := $(INC_kernels) -Iruntime
$(BUILD)/rt_comm_mpi.o: INCLUDES := $(INC_runtime) $(MPI_CFLAGS)
QSHARD    := $(BUILD)/qshard
MPI_LINK   = $(if $(filter 1,$(HAVE_MPI)),$(MPI_LIBS))
LINK_LIBS  = $(DEP_LIBS) $(if $(filter 1,$(HAVE_CUDA)),$(CUDA_LIBS)) $(MPI_LINK)

vpath %.c format convert convert/arch runtime kernels tools tools/serve tests
vpath %.cu kernels runtime tests

.PHONY: carry carry-mpi pack all help test check lint fuzz fuzz-run bench test-gpu bench-gpu bench-batch-gpu bench-actorder-gpu bench-arch-gpu bench-serve-gpu demo sass clean info tests lab lab-run
.DEFAULT_GOAL := all
.SECONDARY:

all: $(QSHARD) tests ## build the qshard binary and the test programs

info:
	@echo "CUDA backend: $(CUDA_STATE)"
	@echo "MPI: $(MPI_STATE)"

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(firstword $(MAKEFILE_LIST)) | sed 's/:.*## /\t/' | awk -F'\t' '{printf "  %-12s %s\n", $$1, $$2}'

$(BUILD):
	$(Q)mkdir -p $(BUILD)

$(BUILD)/%.o: %.c | $(BUILD)
	@[ "$(V)" = 1 ] || echo "  CC    $<"
	$(Q)$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu | $(BUILD)
	@[ "$(V)" = 1 ] || echo "  NVCC  $<"
	$(Q)$(NVCC) $(NVCCFLAGS) $(INCLUDES) -c $< -o $@

$(LIBQS): $(LIB_OBJ)
	@[ "$(V)" = 1 ] || echo "  AR    $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/libcjson.so.1: | $(BUILD)
	$(Q)cp -L $$($(PKG_CONFIG) --variable=libdir libcjson)/libcjson.so.1 $@ 2>/dev/null || true

$(QSHARD): $(TOOL_OBJ) $(LIBQS) $(BUILD)/libcjson.so.1
	@[ "$(V)" = 1 ] || echo "  LD    $@"
	$(Q)$(CC) $(LDFLAGS_ALL) -o $@ $(TOOL_OBJ) $(LIBQS) $(LINK_LIBS) $(SERVE_LIBS)

$(BUILD)/test_%: $(BUILD)/test_%.o $(LIBQS)
	@[ "$(V)" = 1 ] || echo "  LD    $@"
	$(Q)$(CC) $(LDFLAGS_ALL) -o $@ $< $(LIBQS) $(LINK_LIBS)

$(BUILD)/gpu_test_%: tests/gpu_test_%.cu $(LIBQS)
	@[ "$(V)" = 1 ] || echo "  NVCC  $<"
	$(Q)$(NVCC) $(NVCCFLAGS) $(INC_all) -o $@ $< $(LIBQS) $(DEP_LIBS) $(MPI_LINK) -lcublas -lnccl -Xlinker -rpath,'$$ORIGIN'

tests: $(TEST_BIN) $(QSHARD)

# --- kernels/lab: the W4A16 experiments (kernels/lab/README.md) ------------------------------
lab: ## build the kernel experiments of kernels/lab/ into $(BUILD)/lab/ (needs nvcc)
	$(Q)test "$(HAVE_CUDA)" = 1 || { echo "lab needs nvcc (CUDA_HOME=$(CUDA_HOME))"; exit 1; }
	$(Q)$(MAKE) --no-print-directory $(LAB_BIN)

$(BUILD)/lab/%: kernels/lab/%.cu $(LIBQS)
	@[ "$(V)" = 1 ] || echo "  NVCC  $<"
	$(Q)mkdir -p $(BUILD)/lab
	$(Q)$(NVCC) $(NVCCFLAGS) $(INC_kernels) -Iruntime -o $@ $< $(LIBQS) $(DEP_LIBS) -lcublas \
	    -Xlinker -rpath,'$$ORIGIN/..'

lab-run: ## on the GPU machine: run every program of $(BUILD)/lab/ with --quick (PREBUILT=1 as for test-gpu)
ifeq ($(PREBUILT),0)
	$(Q)$(MAKE) --no-print-directory lab
endif
	$(Q)rc=0; for p in $(LAB_BIN); do $$p --quick || rc=1; done; exit $$rc

# the OpenAI SDK for Node that tests/serve/openai_sdk.mjs runs (pinned by package-lock.json),
# installed when missing; without npm the serve suite reports the missing SDK as a failure
SERVE_SDK := tests/serve/node_modules/openai/package.json
$(SERVE_SDK):
	$(Q)npm ci --prefix tests/serve --silent || echo "make: npm ci --prefix tests/serve failed (node/npm missing or no registry)"

test: info tests | $(SERVE_SDK) ## build and run every CPU test (what CI runs)
	$(Q)QSHARD=$(QSHARD) BUILD=$(BUILD) sh tests/run_tests.sh $(TEST_BIN) tests/serve/test_serve.sh tests/test_mpi.sh

check: ## run the CPU tests under AddressSanitizer + UndefinedBehaviorSanitizer
	$(Q)$(MAKE) --no-print-directory BUILD=build-san NO_CUDA=1 OPT="-O1 -fno-omit-frame-pointer" \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined" test

lint: ## size rules of docs/DESIGN.md section 1 (files <= 1200 lines, host functions <= 150); convert/ includes no runtime header but rt_tok.h
	$(Q)python3 tools/lint_size.py
	$(Q)bad=$$(grep -HnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"(rt[a-z_]*|cmd|cli)\.h"' convert/*.c convert/*.h \
	    | grep -v '"rt_tok\.h"'); if [ -n "$$bad" ]; then echo "lint: convert/ may include only rt_tok.h of runtime/ and nothing of tools/:"; echo "$$bad"; exit 1; fi

# --- fuzzing (clang + libFuzzer) -------------------------------------------------------------
FUZZ_BUILD := build-fuzz
FUZZ_SECONDS ?= 60
fuzz: ## build the libFuzzer targets and run each for FUZZ_SECONDS (default 60) on its seed corpus
	$(Q)$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) NO_CUDA=1 CC=clang OPT="-O1 -g" \
	    SAN="-fsanitize=address,undefined,fuzzer-no-link" fuzz-run

FUZZ_BIN := $(patsubst tests/%.c,$(BUILD)/%,$(FUZZ_C))
$(BUILD)/fuzz_%: $(BUILD)/fuzz_%.o $(LIBQS)
	@[ "$(V)" = 1 ] || echo "  LD    $@"
	$(Q)$(CC) $(SAN) -fsanitize=fuzzer -o $@ $< $(LIBQS) $(DEP_LIBS) $(MPI_LINK)

fuzz-run: $(FUZZ_BIN)
	$(Q)QSHARD_FUZZ_SECONDS=$(FUZZ_SECONDS) BUILD=$(BUILD) sh tests/run_fuzz.sh $(FUZZ_BIN)

# --- GPU -----------------------------------------------------------------------------------
test-gpu: ## on the GPU machine: every GPU test (kernels vs references, end to end); PREBUILT=1 runs a carried $(BUILD)/
ifeq ($(PREBUILT),0)
	$(Q)test "$(HAVE_CUDA)" = 1 || { echo "test-gpu needs nvcc (CUDA_HOME=$(CUDA_HOME))"; exit 1; }
	$(Q)$(MAKE) --no-print-directory $(GPU_TEST_BIN) $(QSHARD)
endif
	$(Q)QSHARD=$(QSHARD) BUILD=$(BUILD) sh tests/run_gpu_tests.sh $(GPU_TEST_BIN)

# carry: what the GPU machine (no compiler packages, no cJSON; device tool: 64 MiB of carried
# files next to the working tree) needs to run test-gpu / bench-gpu / lab-run: qshard, the GPU
# tests and the lab programs built for sm_90a only (the three-architecture build is too large),
# plus libcjson.so.1 and libmicrohttpd.so.12 (qshard serve) found through rpath $ORIGIN; libcurl
# (qshard bench serve) is taken from the GPU machine's system. Objects stay in $(CARRY)-obj/, only the binaries go to $(CARRY)/.
CARRY ?= build-dev
CARRY_ARCHS ?= -gencode arch=compute_90a,code=sm_90a
carry: ## build sm_90a binaries (qshard, GPU tests, lab) + libcjson.so.1 into build-dev/ (CARRY=) for a GPU machine without compilers
	$(Q)test "$(HAVE_CUDA)" = 1 || { echo "carry needs nvcc (CUDA_HOME=$(CUDA_HOME))"; exit 1; }
	$(Q)$(MAKE) --no-print-directory BUILD=$(CARRY)-obj CUDA_ARCHS="$(CARRY_ARCHS)" NO_MPI=1 \
	    $(CARRY)-obj/qshard $(CARRY)-obj/test_cli_batch \
	    $(patsubst $(BUILD)/%,$(CARRY)-obj/%,$(GPU_TEST_BIN) $(LAB_BIN))
	$(Q)mkdir -p $(CARRY)/lab
	$(Q)cp $(CARRY)-obj/qshard $(CARRY)-obj/test_cli_batch $(patsubst $(BUILD)/%,$(CARRY)-obj/%,$(GPU_TEST_BIN)) $(CARRY)/
	$(Q)cp $(patsubst $(BUILD)/%,$(CARRY)-obj/%,$(LAB_BIN)) $(CARRY)/lab/
	$(Q)lib=$$($(CC) -print-file-name=libcjson.so.1); case "$$lib" in /*) ;; \
	    *) lib=$$(ldconfig -p | awk '/libcjson.so.1 /{print $$NF; exit}');; esac; \
	    test -f "$$lib" || { echo "carry: libcjson.so.1 not found"; exit 1; }; cp -L "$$lib" $(CARRY)/
	$(Q)lib=$$(ldconfig -p | awk '/libmicrohttpd.so.12 /{print $$NF; exit}'); \
	    test -f "$$lib" || { echo "carry: libmicrohttpd.so.12 not found"; exit 1; }; cp -L "$$lib" $(CARRY)/
	$(Q)echo "carry: $$(du -sh $(CARRY) | cut -f1) in $(CARRY)/: run 'make test-gpu PREBUILT=1 BUILD=$(CARRY)' there"

# carry-mpi: carry, plus qshard-mpi (the same objects linked with MPI) and ompi/ (this machine's
# OpenMPI made relocatable, tools/mpi_bundle.sh) for `make test-gpu` at world size 1 under mpirun
# on a GPU machine without OpenMPI; pack: all of $(CARRY)/ as one xz archive (the fat binaries
# compress ~10x) for a carry limit: `tar xJf $(CARRY)-pack/dev.tar.xz` there first
carry-mpi: carry ## carry + build-dev/qshard-mpi and a relocatable OpenMPI (build-dev/ompi) for the GPU machine
	$(Q)test "$(HAVE_MPI)" = 1 || { echo "carry-mpi needs OpenMPI (apt-get install libopenmpi-dev openmpi-bin)"; exit 1; }
	$(Q)rm -rf $(CARRY)-mpi-obj && cp -a $(CARRY)-obj $(CARRY)-mpi-obj && rm -f $(CARRY)-mpi-obj/libqshard.a $(CARRY)-mpi-obj/qshard
	$(Q)$(MAKE) --no-print-directory BUILD=$(CARRY)-mpi-obj CUDA_ARCHS="$(CARRY_ARCHS)" $(CARRY)-mpi-obj/qshard
	$(Q)cp $(CARRY)-mpi-obj/qshard $(CARRY)/qshard-mpi
	$(Q)sh tools/mpi_bundle.sh $(CARRY)/ompi
pack: ## $(CARRY)/ (stripped, no lab) as $(CARRY)-pack/dev.tar.xz
	$(Q)strip $(CARRY)/qshard* $(CARRY)/gpu_test_* $(CARRY)/test_cli_batch
	$(Q)mkdir -p $(CARRY)-pack && tar cf - --exclude=$(CARRY)/lab $(CARRY) | xz -T0 -6 > $(CARRY)-pack/dev.tar.xz
	$(Q)echo "pack: $$(du -h $(CARRY)-pack/dev.tar.xz | cut -f1): carry $(CARRY)-pack, run 'tar xJf $(CARRY)-pack/dev.tar.xz' first"

bench: $(QSHARD) ## CPU benchmarks: format open/verify, then converter throughput (needs python3-numpy, time)
	$(Q)QSHARD=$(QSHARD) sh tools/bench_cpu.sh
	$(Q)QSHARD=$(QSHARD) sh tools/bench_convert.sh

bench-gpu: $(if $(filter 1,$(PREBUILT)),,$(QSHARD)) ## on the GPU machine: kernel benchmarks (PREBUILT=1 as for test-gpu)
	$(Q)QSHARD=$(QSHARD) sh tools/bench_gpu.sh

bench-batch-gpu: $(if $(filter 1,$(PREBUILT)),,$(QSHARD)) ## on the GPU machine: the batching engine on synthetic 7B / 8B (bench model tg128, bench batch 1..256)
	$(Q)QSHARD=$(QSHARD) sh tools/bench_batch_gpu.sh

bench-actorder-gpu: $(if $(filter 1,$(PREBUILT)),,$(QSHARD)) ## on the GPU machine: act-order's cost (synthetic 7B as AWQ and as GPTQ desc_act: convert, pp512, tg128; the gather kernel)
	$(Q)QSHARD=$(QSHARD) sh tools/bench_actorder_gpu.sh

bench-arch-gpu: $(if $(filter 1,$(PREBUILT)),,$(QSHARD)) ## on the GPU machine: the newer architectures (synthetic Qwen3-8B beside Llama-3-8B, Phi-3-mini, Falcon-7B, MPT-7B, Gemma-2-9B and Gemma-3-1B beside Llama-2-7B: convert, pp512, tg128)
	$(Q)QSHARD=$(QSHARD) sh tools/bench_arch_gpu.sh

bench-load-gpu: $(if $(filter 1,$(PREBUILT)),,$(QSHARD)) ## on the GPU machine: cold start of a synthetic 7B (bench load warm / cold, the upload variants, torch + safetensors beside it)
	$(Q)QSHARD=$(QSHARD) sh tools/bench_load_gpu.sh

bench-serve-gpu: $(if $(filter 1,$(PREBUILT)),,$(QSHARD)) ## on the GPU machine: qshard serve on cuda (answers vs run --prompts, start -> /health, bench serve vs bench batch on a synthetic 7B)
	$(Q)QSHARD=$(QSHARD) sh tools/bench_serve_gpu.sh

demo: $(QSHARD) ## convert the bundled demo model and generate text from it
	$(Q)QSHARD=$(QSHARD) sh tools/demo.sh

sass: $(LIB_OBJ) ## dump register use and SASS of the kernels into $(BUILD)/sass/
	$(Q)mkdir -p $(BUILD)/sass && for o in $(filter %.cu.o,$(LIB_OBJ)); do \
	    $(CUDA_HOME)/bin/cuobjdump --dump-sass $$o > $(BUILD)/sass/$$(basename $$o .cu.o).sass; done

clean: ## remove the build directories (build, build-san, build-fuzz, build-dev(-obj), and BUILD=... if given)
	rm -rf build build-san build-fuzz $(CARRY) $(CARRY)-obj $(filter-out build build-san build-fuzz,$(BUILD))

-include $(wildcard $(BUILD)/*.d $(BUILD)/lab/*.d)
