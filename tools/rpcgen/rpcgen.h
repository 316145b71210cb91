/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* memlan-rpcgen: the ONC RPC language (RFC 5531 section 12, XDR RFC 4506) to C. */
#ifndef MEMLAN_RPCGEN_H
#define MEMLAN_RPCGEN_H

#include <stdio.h>

struct loc {
    const char *file;
    int line, col;
};

/* How a declaration relates its name to its type. */
enum rel { REL_ALIAS, REL_POINTER, REL_VECTOR /* [n] */, REL_ARRAY /* <n> */ };

struct decl {
    char *type;   /* "int", "u_int", "quad_t", "string", "opaque", "void", a user name, ... */
    char *prefix; /* "struct"/"union"/"enum" when written so, else NULL */
    char *name;
    enum rel rel;
    char *size;   /* the bound for VECTOR and ARRAY; NULL = no bound (<>) */
    struct loc at;
};

struct enumval {
    char *name;
    char *value; /* as rpcgen prints it: the given text, or "prev + 1" */
};

struct ucase {
    char **values;
    int nvalues;
    struct decl arm; /* type "void" for an empty arm */
};

struct proc {
    char *name, *number;
    struct decl res;   /* only type/prefix used */
    struct decl *args; /* at least one ("void" when none) */
    int nargs;
    struct loc at;
};

struct version {
    char *name, *number;
    struct proc *procs;
    int nprocs;
};

enum defkind { DEF_CONST, DEF_ENUM, DEF_STRUCT, DEF_UNION, DEF_TYPEDEF, DEF_PROGRAM, DEF_PASS };

struct def {
    enum defkind kind;
    char *name;
    struct loc at;
    char *value;               /* CONST; PROGRAM number; PASS text */
    struct enumval *vals;      /* ENUM */
    int nvals;
    struct decl *decls;        /* STRUCT members, TYPEDEF (one) */
    int ndecls;
    struct decl disc;          /* UNION */
    struct ucase *cases;
    int ncases;
    struct decl *deflt;        /* UNION default arm or NULL */
    struct version *vers;      /* PROGRAM */
    int nvers;
    struct def *next;
};

struct defines {
    char **names, **values;
    int n;
};

/* Parse a file (after the built-in preprocessor with the given defines).  Exits with
 * "file:line:col: error: ..." on the first error. */
struct def *rpcgen_parse(const char *path, struct defines *defs);

struct genopts {
    int mt;              /* -M */
    int newstyle;        /* -N: arguments by value, several allowed */
    const char *header;  /* the header's name, for #include */
    const char *guard;
    char **nettypes;     /* -s (server main) */
    int nnettypes;
    int timeout_secs;    /* -K: 0 = none */
};

void gen_header(FILE *f, struct def *defs, const struct genopts *o);
void gen_xdr(FILE *f, struct def *defs, const struct genopts *o);
void gen_clnt(FILE *f, struct def *defs, const struct genopts *o);
void gen_svc(FILE *f, struct def *defs, const struct genopts *o, int with_main);

/* util */
void *xmalloc(size_t n);
char *xstrdup(const char *s);
char *xprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fatal_at(struct loc at, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

#endif
