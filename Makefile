# memlan - a plain Makefile.  Out of tree: make BUILD=/some/dir.  Sanitizers: make SAN=1.
#   make            libmemlan (shared and static), the memlan CLI, tests and examples
#   make test       install test dependencies, run every test, then again under ASan+UBSan
#   make demo       build and run `memlan bench --quick`
#   make install    PREFIX=/usr/local
CC      ?= cc
BUILD   ?= build
PREFIX  ?= /usr/local
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

CORE_SRC = src/sys/sys.c src/fabric.c src/segment.c src/spin.c src/channel.c src/evq.c \
           src/strerror.c
CORE_OBJ = $(CORE_SRC:%.c=$(BUILD)/obj/%.o)
# The ONC RPC runtime (memlan-rpcgen's fast path) lives in libmemlan and needs libtirpc.
RPC_OBJ  = $(BUILD)/obj/src/rpc/rpc.o
TIRPC_CFLAGS = -I/usr/include/tirpc
TIRPC_LIBS   = -ltirpc
HDRS     = $(wildcard include/*.h include/memlan/*.h src/*.h src/sys/*.h src/preload/*.h)

PRELOAD_SRC = $(wildcard src/preload/*.c)
PRELOAD_OBJ = $(PRELOAD_SRC:%.c=$(BUILD)/obj/%.o)
PRELOAD_SO  = $(BUILD)/lib/libmemlan-preload.so
LIB_SO   = $(BUILD)/lib/libmemlan.so
LIB_A    = $(BUILD)/lib/libmemlan.a
CLI      = $(BUILD)/bin/memlan
CLI_SRC  = tools/memlan.c bench/bench.c bench/floors.c bench/plot.c
RPCGEN   = $(BUILD)/bin/memlan-rpcgen
RPCGEN_SRC = tools/rpcgen/parse.c tools/rpcgen/gen.c
TESTS    = $(patsubst tests/c/%.c,$(BUILD)/tests/%,$(wildcard tests/c/*.c))
PTESTS   = $(patsubst tests/preload/%.c,$(BUILD)/tests-preload/%,$(wildcard tests/preload/*.c))
EXAMPLES = $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))
BPROGS   = $(BUILD)/bench/shortconn

all: $(LIB_SO) $(LIB_A) $(PRELOAD_SO) $(CLI) $(RPCGEN) $(TESTS) $(PTESTS) $(EXAMPLES) $(BPROGS)

$(BUILD)/obj/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -c $< -o $@

$(RPC_OBJ): src/rpc/rpc.c include/memlan/rpc.h $(HDRS) | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(TIRPC_CFLAGS) -fPIC -c $< -o $@

# Build dependencies beyond a compiler (libtirpc-dev, rpcsvc-proto): installed when missing.
deps:
	@./scripts/install-deps.sh

$(LIB_SO): $(CORE_OBJ) $(RPC_OBJ) src/libmemlan.map
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,--version-script=src/libmemlan.map -Wl,-soname,libmemlan.so.0 \
	    -o $@.0 $(CORE_OBJ) $(RPC_OBJ) $(LDFLAGS) $(TIRPC_LIBS)
	ln -sf libmemlan.so.0 $@

# The preload library: the core and the interposers, exporting only the interposers.
$(BUILD)/preload.map: src/preload/exports.map.in src/preload/calls.h
	@mkdir -p $(dir $@)
	$(CC) -E -P -x c -Isrc/preload $< -o $@

$(PRELOAD_SO): $(CORE_OBJ) $(PRELOAD_OBJ) $(BUILD)/preload.map
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,--version-script=$(BUILD)/preload.map -Wl,-soname,libmemlan-preload.so \
	    -o $@ $(CORE_OBJ) $(PRELOAD_OBJ) $(LDFLAGS) -ldl

$(LIB_A): $(CORE_OBJ) $(RPC_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# The CLI and the tests link the static library: the tests reach internal symbols.
$(CLI): $(CLI_SRC) $(LIB_A) $(HDRS) bench/bench.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Ibench -o $@ $(CLI_SRC) $(LIB_A) $(LDFLAGS) -lm

$(RPCGEN): $(RPCGEN_SRC) tools/rpcgen/rpcgen.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $(RPCGEN_SRC) $(LDFLAGS)

$(BUILD)/tests/%: tests/c/%.c tests/c/test.h $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/c -o $@ $< $(LIB_A) $(LDFLAGS)

# Programs that the preload tests run over kernel TCP and under memlan: plain POSIX, no memlan.
$(BUILD)/tests-preload/%: tests/preload/%.c
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

test: all
	./scripts/test.sh

demo: all
	$(CLI) bench --quick

install: $(LIB_SO) $(LIB_A) $(PRELOAD_SO) $(CLI) $(RPCGEN)
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/include/memlan
	install -m 755 $(LIB_SO).0 $(DESTDIR)$(PREFIX)/lib/libmemlan.so.0
	ln -sf libmemlan.so.0 $(DESTDIR)$(PREFIX)/lib/libmemlan.so
	install -m 644 $(LIB_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(PRELOAD_SO) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(CLI) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 include/memlan.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 include/memlan/layout.h include/memlan/rpc.h $(DESTDIR)$(PREFIX)/include/memlan/
	install -m 755 $(RPCGEN) $(DESTDIR)$(PREFIX)/bin/

clean:
	rm -rf $(BUILD) build-asan

.PHONY: all test demo install clean deps
