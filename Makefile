# SPDX-License-Identifier: Apache-2.0 OR MIT
# memlan - a plain Makefile.  Out of tree: make BUILD=/some/dir.  Sanitizers: make SAN=1.
#   make            libmemlan and libmemlan-rpc (shared and static), the preload library, the
#                   memlan CLI, memlan-rpcgen, tests and examples.  Never installs packages.
#   make deps       install the build dependencies (libtirpc-dev, rpcsvc-proto, pkg-config, man-db)
#   make test       make deps, then run every test, then again under ASan+UBSan
#   make test-seeds only the papers' systems (NFS, omniORB, MPI) under memlan, installing them
#   make demo       build and run `memlan bench --quick`
#   make chaos      the long chaos suite (tests/chaos/chaos.py --long)
#   make install    PREFIX BINDIR LIBDIR INCLUDEDIR MANDIR PKGCONFIGDIR DESTDIR, as a packager
#   make uninstall  the same variables: removes exactly what install wrote
CC      ?= cc
BUILD   ?= build
# Installation directories (GNU names).  LIBDIR is compiled into `memlan run`, which looks for
# libmemlan-preload.so there when it runs from BINDIR; DESTDIR is only a staging root.
PREFIX       ?= /usr/local
BINDIR       ?= $(PREFIX)/bin
LIBDIR       ?= $(PREFIX)/lib
INCLUDEDIR   ?= $(PREFIX)/include
MANDIR       ?= $(PREFIX)/share/man
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig

# The version is the public header's; the shared libraries' real names carry all of it, their
# sonames the major number alone (src/libmemlan.map versions the symbols).
ver = $(shell sed -n 's/^\#define MEMLAN_VERSION_$(1) *//p' include/memlan.h)
VERSION := $(call ver,MAJOR).$(call ver,MINOR).$(call ver,PATCH)
SOMAJOR := $(call ver,MAJOR)
SAN     ?= 0
WERROR  ?= $(if $(CI),-Werror,)

CFLAGS_BASE = -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wshadow -Wno-unused-parameter $(WERROR) \
              -Iinclude -Isrc -fvisibility=hidden -pthread
ifeq ($(SAN),1)
OPT     = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
LDSAN   = -fsanitize=address,undefined
else
OPT     = -O2 -g
LDSAN   =
endif
CFLAGS  += $(CFLAGS_BASE) $(OPT)
LDFLAGS += $(LDSAN) -pthread

CORE_SRC = src/sys/sys.c src/acl.c src/fabric.c src/guard.c src/segment.c src/spin.c src/channel.c src/evq.c \
           src/strerror.c src/endpoint.c src/heap.c
CORE_OBJ = $(CORE_SRC:%.c=$(BUILD)/obj/%.o)
# The ONC RPC runtime (memlan-rpcgen's fast path) is a library of its own, libmemlan-rpc, so
# that libmemlan itself needs nothing but libc; only libmemlan-rpc needs libtirpc.
RPC_OBJ  = $(BUILD)/obj/src/rpc/rpc.o
TIRPC_CFLAGS ?= -I/usr/include/tirpc
TIRPC_LIBS   ?= -ltirpc
HDRS     = $(wildcard include/*.h include/memlan/*.h src/*.h src/sys/*.h src/preload/*.h)

PRELOAD_SRC = $(wildcard src/preload/*.c)
PRELOAD_OBJ = $(PRELOAD_SRC:%.c=$(BUILD)/obj/%.o)
PRELOAD_SO  = $(BUILD)/lib/libmemlan-preload.so
LIB_SO   = $(BUILD)/lib/libmemlan.so
LIB_A    = $(BUILD)/lib/libmemlan.a
RPC_SO   = $(BUILD)/lib/libmemlan-rpc.so
RPC_A    = $(BUILD)/lib/libmemlan-rpc.a
PCFILES  = $(BUILD)/pkgconfig/memlan.pc $(BUILD)/pkgconfig/memlan-rpc.pc
CLI      = $(BUILD)/bin/memlan
CLI_SRC  = tools/memlan.c bench/bench.c bench/floors.c bench/plot.c
RPCGEN   = $(BUILD)/bin/memlan-rpcgen
RPCGEN_SRC = tools/rpcgen/parse.c tools/rpcgen/gen.c
TESTS    = $(patsubst tests/c/%.c,$(BUILD)/tests/%,$(wildcard tests/c/*.c))
PTESTS   = $(patsubst tests/preload/%.c,$(BUILD)/tests-preload/%,$(wildcard tests/preload/*.c))
EXAMPLES = $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))
BPROGS   = $(BUILD)/bench/shortconn

all: $(LIB_SO) $(LIB_A) $(RPC_SO) $(RPC_A) $(PCFILES) $(PRELOAD_SO) $(CLI) $(RPCGEN) $(TESTS) $(PTESTS) $(EXAMPLES) $(BPROGS)

$(BUILD)/obj/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -c $< -o $@

# The preload's cleanup handlers (pthread_cleanup_push in pqueue.c, poll.c, epoll.c, sock.c and
# interpose.c) must be unwinding cleanups, as glibc's own are: without -fexceptions glibc
# registers each in the thread, and a
# handler's siglongjmp out of a poll left the registration pointing into a dead frame, which a
# later pthread_exit or pthread_cancel of that thread jumped into (SIGSEGV; over kernel TCP it
# exits cleanly: tests/preload/pollcancel.c).
$(PRELOAD_OBJ): CFLAGS += -fexceptions

# libtirpc's headers are a build dependency; `make` says so rather than installing them.
$(RPC_OBJ): src/rpc/rpc.c include/memlan/rpc.h $(HDRS)
	@mkdir -p $(dir $@)
	@echo '#include <rpc/rpc.h>' | $(CC) $(TIRPC_CFLAGS) -E -x c - >/dev/null 2>&1 || { \
	    echo "error: libtirpc's headers (rpc/rpc.h with $(TIRPC_CFLAGS)) are missing:" \
	         "run make deps (or install libtirpc-dev)" >&2; exit 1; }
	$(CC) $(CFLAGS) $(TIRPC_CFLAGS) -fPIC -c $< -o $@

# Build dependencies beyond a compiler (libtirpc-dev, rpcsvc-proto, pkg-config, man-db),
# installed when missing; needs root or sudo.  Only this target and `make test` run it.
deps:
	./scripts/install-deps.sh

# Real name libmemlan.so.X.Y.Z, soname libmemlan.so.X, link name libmemlan.so.
$(LIB_SO): $(CORE_OBJ) src/libmemlan.map
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,--version-script=src/libmemlan.map -Wl,-soname,libmemlan.so.$(SOMAJOR) \
	    -Wl,--no-undefined -o $@.$(VERSION) $(CORE_OBJ) $(LDFLAGS)
	ln -sf libmemlan.so.$(VERSION) $@.$(SOMAJOR)
	ln -sf libmemlan.so.$(SOMAJOR) $@

# libmemlan-rpc: the RPC runtime over libmemlan's exported API (and its MEMLAN_PRIVATE symbols).
# It finds libmemlan.so.0 beside itself ($ORIGIN): a program's own rpath (DT_RUNPATH) does not
# reach the libraries its libraries need.  A distribution that installs both on the linker's
# default path may drop that with RPC_RPATH=.
RPC_RPATH ?= -Wl,-rpath,'$$ORIGIN'
$(RPC_SO): $(RPC_OBJ) src/rpc/libmemlan-rpc.map $(LIB_SO)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,--version-script=src/rpc/libmemlan-rpc.map \
	    -Wl,-soname,libmemlan-rpc.so.$(SOMAJOR) -Wl,--no-undefined -o $@.$(VERSION) $(RPC_OBJ) \
	    -L$(BUILD)/lib -lmemlan $(RPC_RPATH) $(LDFLAGS) $(TIRPC_LIBS)
	ln -sf libmemlan-rpc.so.$(VERSION) $@.$(SOMAJOR)
	ln -sf libmemlan-rpc.so.$(SOMAJOR) $@

$(RPC_A): $(RPC_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# pkg-config files, for the installed paths.  $(BUILD)/paths.stamp changes when they do.
$(BUILD)/paths.stamp: FORCE
	@mkdir -p $(dir $@)
	@printf '%s\n' '$(VERSION)' '$(BINDIR)' '$(LIBDIR)' '$(INCLUDEDIR)' > $@.tmp
	@cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@

$(BUILD)/pkgconfig/%.pc: src/%.pc.in $(BUILD)/paths.stamp
	@mkdir -p $(dir $@)
	sed -e 's|@VERSION@|$(VERSION)|' -e 's|@LIBDIR@|$(LIBDIR)|' \
	    -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' $< > $@

# The preload library: the core and the interposers, exporting only the interposers.
$(BUILD)/preload.map: src/preload/exports.map.in src/preload/calls.h
	@mkdir -p $(dir $@)
	$(CC) -E -P -x c -Isrc/preload $< -o $@

$(PRELOAD_SO): $(CORE_OBJ) $(PRELOAD_OBJ) $(BUILD)/preload.map
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,--version-script=$(BUILD)/preload.map -Wl,-soname,libmemlan-preload.so \
	    -o $@ $(CORE_OBJ) $(PRELOAD_OBJ) $(LDFLAGS) -ldl

$(LIB_A): $(CORE_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# The CLI and the tests link the static library: the tests reach internal symbols.  The CLI
# knows BINDIR and LIBDIR: installed, it loads the preload library from LIBDIR.
$(CLI): $(CLI_SRC) $(LIB_A) $(HDRS) bench/bench.h $(BUILD)/paths.stamp
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Ibench -DMEMLAN_BINDIR='"$(BINDIR)"' -DMEMLAN_LIBDIR='"$(LIBDIR)"' \
	    -o $@ $(CLI_SRC) $(LIB_A) $(LDFLAGS) -lm

$(RPCGEN): $(RPCGEN_SRC) tools/rpcgen/rpcgen.h include/memlan.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DMEMLAN_RPCGEN_VERSION='"$(VERSION)"' -o $@ $(RPCGEN_SRC) $(LDFLAGS)

$(BUILD)/tests/%: tests/c/%.c tests/c/test.h $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/c -o $@ $< $(LIB_A) $(LDFLAGS)

# Programs that the preload tests run over kernel TCP and under memlan: plain POSIX, no memlan.
$(BUILD)/tests-preload/%: tests/preload/%.c $(wildcard tests/preload/*.h)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -Wall -Wextra $(WERROR) $(OPT) -o $@ $< $(LDFLAGS)

# Bench programs run over kernel TCP and under memlan alike: plain POSIX too.
$(BUILD)/bench/%: bench/%.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -Wall -Wextra $(WERROR) $(OPT) -o $@ $< $(LDFLAGS)

# Examples use only the public header and the shared library.
$(BUILD)/examples/%: examples/%.c include/memlan.h $(LIB_SO)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -Wall -Wextra $(WERROR) $(OPT) -Iinclude -o $@ $< \
	    -L$(BUILD)/lib -Wl,-rpath,'$$ORIGIN/../lib' -lmemlan $(LDFLAGS)

test:
	$(MAKE) deps
	$(MAKE) all
	./scripts/test.sh

# The papers' systems (nfs-ganesha, omniORB, Open MPI, MPICH) under memlan, data checked; part
# of `make test` too.  scripts/install-seeds.sh installs their Debian packages.
test-seeds: all
	./scripts/install-seeds.sh
	python3 -m pytest -q tests/py/test_seeds.py

# The transparent-socket suite (tests/py/test_preload.py) with the ASan+UBSan build: memlan run
# loads the instrumented preload library into the instrumented test programs.  Two ASan options
# make that work: verify_asan_link_order=0, since memlan run puts the preload library first in
# LD_PRELOAD, ahead of the ASan runtime it needs; disable_coredump=0, since ASan's start-up calls
# setrlimit, which the preload library interposes, before ASan's shadow memory exists (SIGSEGV).
# forkrace is left out: LeakSanitizer's check at the exit of each of its 300 forked children
# can take it past its 30 s alarm on a loaded machine (seen over kernel TCP too).  Not part of `make test`: under ASan sigrace
# runs close to its 60 s limit on a loaded machine (it timed out once in one run of 2026-11-23).
ASAN_PRELOAD_OPTIONS = verify_asan_link_order=0:disable_coredump=0:detect_leaks=1:abort_on_error=1
test-preload-asan:
	$(MAKE) SAN=1 BUILD=build-asan all
	BUILD=$(abspath build-asan) ASAN_OPTIONS=$(ASAN_PRELOAD_OPTIONS) \
	    UBSAN_OPTIONS=print_stacktrace=1 python3 -m pytest -q tests/py/test_preload.py \
	    -k 'not fork_racing'

# The chaos suite, long version (kill storms, the vandal, a full fabric; docs/results.md).  Its
# short version runs inside `make test`.  CHAOS_SCALE=0.25 shortens it.
chaos: all
	$(MAKE) SAN=1 BUILD=build-asan all
	BUILD=$(abspath $(BUILD)) python3 tests/chaos/chaos.py --long

demo:
	$(MAKE) deps
	$(MAKE) all
	$(CLI) bench --quick

# Man pages: committed under man/, generated from the headers and docs/man/ by
# scripts/gen-man.py (tests/py/test_docs.py fails when they are stale).
MAN1 = $(wildcard man/man1/*.1)
MAN3 = $(wildcard man/man3/*.3)
MAN7 = $(wildcard man/man7/*.7)

install: $(LIB_SO) $(LIB_A) $(RPC_SO) $(RPC_A) $(PCFILES) $(PRELOAD_SO) $(CLI) $(RPCGEN)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR)/memlan \
	    $(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man3 \
	    $(DESTDIR)$(MANDIR)/man7
	install -m 755 $(CLI) $(RPCGEN) $(DESTDIR)$(BINDIR)/
	install -m 755 $(LIB_SO).$(VERSION) $(RPC_SO).$(VERSION) $(PRELOAD_SO) $(DESTDIR)$(LIBDIR)/
	for l in libmemlan libmemlan-rpc; do \
	    ln -sf $$l.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$$l.so.$(SOMAJOR) && \
	    ln -sf $$l.so.$(SOMAJOR) $(DESTDIR)$(LIBDIR)/$$l.so || exit 1; done
	install -m 644 $(LIB_A) $(RPC_A) $(DESTDIR)$(LIBDIR)/
	install -m 644 include/memlan.h $(DESTDIR)$(INCLUDEDIR)/
	install -m 644 include/memlan/layout.h include/memlan/rpc.h $(DESTDIR)$(INCLUDEDIR)/memlan/
	install -m 644 $(PCFILES) $(DESTDIR)$(PKGCONFIGDIR)/
	install -m 644 $(MAN1) $(DESTDIR)$(MANDIR)/man1/
	install -m 644 $(MAN3) $(DESTDIR)$(MANDIR)/man3/
	install -m 644 $(MAN7) $(DESTDIR)$(MANDIR)/man7/

# Removes what install wrote, then the directories it made if they are left empty.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/memlan $(DESTDIR)$(BINDIR)/memlan-rpcgen
	for l in libmemlan libmemlan-rpc; do \
	    rm -f $(DESTDIR)$(LIBDIR)/$$l.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$$l.so.$(SOMAJOR) \
	          $(DESTDIR)$(LIBDIR)/$$l.so $(DESTDIR)$(LIBDIR)/$$l.a; done
	rm -f $(DESTDIR)$(LIBDIR)/libmemlan-preload.so
	rm -f $(DESTDIR)$(INCLUDEDIR)/memlan.h $(DESTDIR)$(INCLUDEDIR)/memlan/layout.h \
	      $(DESTDIR)$(INCLUDEDIR)/memlan/rpc.h
	rm -f $(DESTDIR)$(PKGCONFIGDIR)/memlan.pc $(DESTDIR)$(PKGCONFIGDIR)/memlan-rpc.pc
	rm -f $(MAN1:man/%=$(DESTDIR)$(MANDIR)/%) $(MAN3:man/%=$(DESTDIR)$(MANDIR)/%) \
	      $(MAN7:man/%=$(DESTDIR)$(MANDIR)/%)
	-rmdir $(DESTDIR)$(INCLUDEDIR)/memlan $(DESTDIR)$(PKGCONFIGDIR) 2>/dev/null

clean:
	rm -rf $(BUILD) build-asan

FORCE:

.PHONY: all test test-seeds test-preload-asan chaos demo install uninstall clean deps FORCE
