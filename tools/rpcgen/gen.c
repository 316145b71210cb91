/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * memlan-rpcgen's back end: the header, XDR routines, client stubs and server skeleton, with
 * rpcgen's interface (type names, xdr_NAME, name_V(args, CLIENT *), name_V_svc, prog_V
 * dispatch, prog_V_freeresult) so code written against rpcgen's output compiles unchanged.
 * The XDR routines call libtirpc's primitives, so the bytes on the wire are rpcgen's.  The
 * header includes <memlan/rpc.h>, which gives clnt_create, svc_register and svc_run the
 * shared-memory fast path (see src/rpc/rpc.c); define MEMLAN_RPC_PLAIN to compile without it.
 */
#include "rpcgen.h"

#include <ctype.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* The C type of a type name (no declarator). */
/* Results live in a small ring of buffers: several may appear in one printf. */
static char *scratch(void)
{
    static char bufs[8][256];
    static unsigned next;
    return bufs[next++ % 8];
}

static const char *ptype(const struct decl *d);

static const char *ctype(const struct decl *d)
{
    char *buf = scratch();
    const size_t bufsz = 256;
    const char *t = d->type;
    if (!strcmp(t, "bool"))
        return "bool_t";
    if (!strcmp(t, "string"))
        return "char *";
    if (!strcmp(t, "opaque"))
        return "char";
    if (d->prefix && strcmp(d->prefix, "struct") == 0) {
        snprintf(buf, bufsz, "struct %s", t);
        return buf;
    }
    if (d->prefix) {
        snprintf(buf, bufsz, "%s %s", d->prefix, t);
        return buf;
    }
    return t;
}

/* The XDR routine for one value of a type. */
static const char *xdrfn(const struct decl *d)
{
    char *buf = scratch();
    const size_t bufsz = 256;
    const char *t = d->type;
    if (!strcmp(t, "string"))
        return "xdr_wrapstring";
    snprintf(buf, bufsz, "xdr_%s", t);
    return buf;
}

/* xdr_void is declared (void): a cast through void (*)(void) keeps -Wextra quiet */
#define XVOID "(void (*)(void)) xdr_void"

static const char *bound(const struct decl *d)
{
    return d->size ? d->size : "~0";
}

static char *lower(const char *s)
{
    char *r = xstrdup(s);
    for (char *q = r; *q; q++)
        *q = (char)tolower((unsigned char)*q);
    return r;
}

static void pass(FILE *f, const struct def *d)
{
    fprintf(f, "%s\n", d->value);
}

/*
 * -N (newstyle): arguments are passed by value, and a procedure of several arguments gets a
 * struct NAME_V_argument { arg1; arg2; ... } that goes over the wire (rpcgen's names).
 */
static int multi(const struct proc *pr)
{
    return pr->nargs > 1;
}

static int noarg(const struct proc *pr)
{
    return !strcmp(pr->args[0].type, "void");
}

/* "int arg1, pt arg2, " (with names) or "int , pt , " (prototype): the value arguments */
static void value_params(FILE *f, const struct proc *pr, int named)
{
    if (noarg(pr))
        return;
    for (int i = 0; i < pr->nargs; i++) {
        if (named)
            fprintf(f, "%s arg%d, ", ptype(&pr->args[i]), i + 1);
        else
            fprintf(f, "%s , ", ptype(&pr->args[i]));
    }
}

/* the argument structure's struct member for arg i, as a declaration */
static struct decl arg_member(const struct proc *pr, int i)
{
    struct decl d = pr->args[i];
    d.name = xprintf("arg%d", i + 1);
    d.rel = REL_ALIAS;
    return d;
}

/* the C type of what goes over the wire: NAME_V_argument, the one argument's type, or void */
static const char *wire_arg_type(const struct proc *pr, const char *ln, const char *vers)
{
    if (multi(pr)) {
        char *buf = scratch();
        snprintf(buf, 256, "%s_%s_argument", ln, vers);
        return buf;
    }
    return ptype(&pr->args[0]);
}

static const char *wire_arg_xdr(const struct proc *pr, const char *ln, const char *vers)
{
    if (multi(pr)) {
        char *buf = scratch();
        snprintf(buf, 256, "xdr_%s_%s_argument", ln, vers);
        return buf;
    }
    return noarg(pr) ? XVOID : xdrfn(&pr->args[0]);
}

/* ---- header ----------------------------------------------------------------------------- */

/* One declaration as a struct member or union arm; self is the enclosing struct's name. */
static void pdecl(FILE *f, const char *ind, const struct decl *d, const char *self)
{
    if (!strcmp(d->type, "void"))
        return;
    const char *ct = ctype(d);
    char sbuf[256];
    if (self && !d->prefix && !strcmp(d->type, self)) {
        snprintf(sbuf, sizeof sbuf, "struct %s", self);
        ct = sbuf;
    }
    if (!strcmp(d->type, "string")) {
        fprintf(f, "%schar *%s;\n", ind, d->name);
        return;
    }
    switch (d->rel) {
    case REL_ALIAS:
        fprintf(f, "%s%s %s;\n", ind, ct, d->name);
        break;
    case REL_POINTER:
        fprintf(f, "%s%s *%s;\n", ind, ct, d->name);
        break;
    case REL_VECTOR:
        fprintf(f, "%s%s %s[%s];\n", ind, ct, d->name, d->size);
        break;
    case REL_ARRAY:
        fprintf(f, "%sstruct {\n%s\tu_int %s_len;\n%s\t%s *%s_val;\n%s} %s;\n", ind, ind, d->name,
                ind, ct, d->name, ind, d->name);
        break;
    }
}

static void hdr_typedef(FILE *f, const struct decl *d)
{
    const char *ct = ctype(d);
    if (!strcmp(d->type, "string")) {
        fprintf(f, "typedef char *%s;\n\n", d->name);
        return;
    }
    switch (d->rel) {
    case REL_ALIAS:
        fprintf(f, "typedef %s %s;\n\n", ct, d->name);
        break;
    case REL_POINTER:
        fprintf(f, "typedef %s *%s;\n\n", ct, d->name);
        break;
    case REL_VECTOR:
        fprintf(f, "typedef %s %s[%s];\n\n", ct, d->name, d->size);
        break;
    case REL_ARRAY:
        fprintf(f, "typedef struct {\n\tu_int %s_len;\n\t%s *%s_val;\n} %s;\n\n", d->name, ct,
                d->name, d->name);
        break;
    }
}

/* C type of a procedure's argument or result, as rpcgen names it. */
static const char *ptype(const struct decl *d)
{
    if (!strcmp(d->type, "void"))
        return "void";
    return ctype(d);
}

static void member(FILE *f, const char *ind, const struct decl *d, const char *within);

enum argpart { ARG_STRUCT, ARG_XDR_PROTO, ARG_XDR_FN };

/* -N: for each procedure of several arguments in program d, its NAME_V_argument struct, the
 * prototype of its XDR routine, or the routine itself. */
static void argument_structs(FILE *f, const struct def *d, enum argpart part)
{
    for (int v = 0; v < d->nvers; v++)
        for (int i = 0; i < d->vers[v].nprocs; i++) {
            const struct proc *pr = &d->vers[v].procs[i];
            if (!multi(pr))
                continue;
            char *ln = lower(pr->name);
            const char *vn = d->vers[v].number;
            if (part == ARG_XDR_PROTO) {
                fprintf(f, "extern  bool_t xdr_%s_%s_argument (XDR *, %s_%s_argument*);\n", ln,
                        vn, ln, vn);
                free(ln);
                continue;
            }
            if (part == ARG_STRUCT)
                fprintf(f, "struct %s_%s_argument {\n", ln, vn);
            else
                fprintf(f, "bool_t\nxdr_%s_%s_argument (XDR *xdrs, %s_%s_argument *objp)\n{\n",
                        ln, vn, ln, vn);
            for (int k = 0; k < pr->nargs; k++) {
                struct decl m = arg_member(pr, k);
                if (part == ARG_STRUCT)
                    pdecl(f, "\t", &m, NULL);
                else
                    member(f, "\t", &m, "");
                free(m.name);
            }
            if (part == ARG_STRUCT)
                fprintf(f, "};\ntypedef struct %s_%s_argument %s_%s_argument;\n\n", ln, vn, ln,
                        vn);
            else
                fprintf(f, "\treturn TRUE;\n}\n\n");
            free(ln);
        }
}

static void hdr_program(FILE *f, const struct def *d, const struct genopts *o)
{
    if (o->newstyle)
        argument_structs(f, d, ARG_STRUCT);
    fprintf(f, "#define %s %s\n", d->name, d->value);
    for (int v = 0; v < d->nvers; v++) {
        const struct version *ve = &d->vers[v];
        fprintf(f, "#define %s %s\n\n", ve->name, ve->number);
        for (int i = 0; i < ve->nprocs; i++) {
            const struct proc *pr = &ve->procs[i];
            char *ln = lower(pr->name);
            const char *at = ptype(&pr->args[0]), *rt = ptype(&pr->res);
            fprintf(f, "#define %s %s\n", pr->name, pr->number);
            if (o->newstyle) {
                const char *cs[] = {"", "_svc"}, *tail[] = {"CLIENT *", "struct svc_req *"};
                for (int k = 0; k < 2; k++) {
                    if (o->mt)
                        fprintf(f, "extern  %s %s_%s%s(", k ? "bool_t" : "enum clnt_stat", ln,
                                ve->number, cs[k]);
                    else
                        fprintf(f, "extern  %s * %s_%s%s(", rt, ln, ve->number, cs[k]);
                    value_params(f, pr, 0);
                    if (o->mt)
                        fprintf(f, "%s *, ", rt);
                    fprintf(f, "%s);\n", tail[k]);
                }
            } else if (o->mt) {
                fprintf(f, "extern  enum clnt_stat %s_%s(%s *, %s *, CLIENT *);\n", ln,
                        ve->number, at, rt);
                fprintf(f, "extern  bool_t %s_%s_svc(%s *, %s *, struct svc_req *);\n", ln,
                        ve->number, at, rt);
            } else {
                fprintf(f, "extern  %s * %s_%s(%s *, CLIENT *);\n", rt, ln, ve->number, at);
                fprintf(f, "extern  %s * %s_%s_svc(%s *, struct svc_req *);\n", rt, ln,
                        ve->number, at);
            }
            free(ln);
        }
        char *lp = lower(d->name);
        fprintf(f, "extern int %s_%s_freeresult (SVCXPRT *, xdrproc_t, caddr_t);\n", lp,
                ve->number);
        fprintf(f, "\n");
        free(lp);
    }
}

void gen_header(FILE *f, struct def *defs, const struct genopts *o)
{
    fprintf(f, "/*\n * Please do not edit this file.\n * It was generated using memlan-rpcgen.\n"
               " */\n\n#ifndef %s\n#define %s\n\n#include <rpc/rpc.h>\n"
               "#ifndef MEMLAN_RPC_PLAIN\n#include <memlan/rpc.h>\n#endif\n\n"
               "#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n",
            o->guard, o->guard);
    for (struct def *d = defs; d; d = d->next) {
        switch (d->kind) {
        case DEF_PASS:
            pass(f, d);
            break;
        case DEF_CONST:
            fprintf(f, "#define %s %s\n\n", d->name, d->value);
            break;
        case DEF_ENUM:
            fprintf(f, "enum %s {\n", d->name);
            for (int i = 0; i < d->nvals; i++)
                fprintf(f, "\t%s = %s,\n", d->vals[i].name, d->vals[i].value);
            fprintf(f, "};\ntypedef enum %s %s;\n\n", d->name, d->name);
            break;
        case DEF_STRUCT:
            fprintf(f, "struct %s {\n", d->name);
            for (int i = 0; i < d->ndecls; i++)
                pdecl(f, "\t", &d->decls[i], d->name);
            fprintf(f, "};\ntypedef struct %s %s;\n\n", d->name, d->name);
            break;
        case DEF_UNION: {
            fprintf(f, "struct %s {\n", d->name);
            pdecl(f, "\t", &d->disc, NULL);
            fprintf(f, "\tunion {\n");
            int arms = 0;
            for (int i = 0; i < d->ncases; i++) {
                pdecl(f, "\t\t", &d->cases[i].arm, d->name);
                arms += strcmp(d->cases[i].arm.type, "void") != 0;
            }
            if (d->deflt) {
                pdecl(f, "\t\t", d->deflt, d->name);
                arms += strcmp(d->deflt->type, "void") != 0;
            }
            if (!arms) /* an empty union is not C */
                fprintf(f, "\t\tchar memlan_rpcgen_no_arm_;\n");
            fprintf(f, "\t} %s_u;\n};\ntypedef struct %s %s;\n\n", d->name, d->name, d->name);
            break;
        }
        case DEF_TYPEDEF:
            hdr_typedef(f, d->decls);
            break;
        case DEF_PROGRAM:
            break; /* after every type: a program may name a type defined below it */
        }
    }
    for (struct def *d = defs; d; d = d->next)
        if (d->kind == DEF_PROGRAM)
            hdr_program(f, d, o);
    fprintf(f, "/* the xdr functions */\n\n");
    for (struct def *d = defs; d; d = d->next) {
        if (d->kind == DEF_ENUM || d->kind == DEF_STRUCT || d->kind == DEF_UNION)
            fprintf(f, "extern  bool_t xdr_%s (XDR *, %s*);\n", d->name, d->name);
        else if (d->kind == DEF_TYPEDEF && d->decls->rel == REL_VECTOR)
            fprintf(f, "extern  bool_t xdr_%s (XDR *, %s);\n", d->name, d->name);
        else if (d->kind == DEF_TYPEDEF)
            fprintf(f, "extern  bool_t xdr_%s (XDR *, %s*);\n", d->name, d->name);
        else if (d->kind == DEF_PROGRAM && o->newstyle)
            argument_structs(f, d, ARG_XDR_PROTO);
    }
    fprintf(f, "\n#ifdef __cplusplus\n}\n#endif\n\n#endif /* !%s */\n", o->guard);
}

/* ---- XDR routines ----------------------------------------------------------------------- */

/*
 * One XDR call.  addr: the value's address ("&objp->x", or "objp" in a typedef's routine);
 * base: where the _len/_val members of a variable array live ("objp->x." or "objp->").
 */
static void xdr_stmt(FILE *f, const char *ind, const struct decl *d, const char *addr,
                     const char *base)
{
    const char *t = d->type;
    if (!strcmp(t, "void"))
        return;
    fprintf(f, "%sif (!", ind);
    if (!strcmp(t, "string")) {
        fprintf(f, "xdr_string (xdrs, %s, %s)", addr, bound(d));
    } else if (d->rel == REL_ALIAS) {
        fprintf(f, "%s (xdrs, %s)", xdrfn(d), addr);
    } else if (d->rel == REL_POINTER) {
        fprintf(f, "xdr_pointer (xdrs, (char **)%s, sizeof (%s), (xdrproc_t) %s)", addr,
                ctype(d), xdrfn(d));
    } else if (d->rel == REL_VECTOR && !strcmp(t, "opaque")) {
        fprintf(f, "xdr_opaque (xdrs, (char *)%s, %s)", addr, d->size);
    } else if (d->rel == REL_VECTOR) {
        fprintf(f, "xdr_vector (xdrs, (char *)%s, %s,\n%s\tsizeof (%s), (xdrproc_t) %s)", addr,
                d->size, ind, ctype(d), xdrfn(d));
    } else if (!strcmp(t, "opaque")) {
        fprintf(f, "xdr_bytes (xdrs, (char **)&%s%s_val, (u_int *) &%s%s_len, %s)", base,
                d->name, base, d->name, bound(d));
    } else {
        fprintf(f, "xdr_array (xdrs, (char **)&%s%s_val, (u_int *) &%s%s_len, %s,\n%s\tsizeof "
                   "(%s), (xdrproc_t) %s)",
                base, d->name, base, d->name, bound(d), ind, ctype(d), xdrfn(d));
    }
    fprintf(f, ")\n%s\treturn FALSE;\n", ind);
}

static struct def *g_defs; /* the definitions being generated */

/* A name that a typedef made a fixed-size array: its values are passed without '&'. */
static int is_vector_typedef(const char *name)
{
    for (struct def *d = g_defs; d; d = d->next)
        if (d->kind == DEF_TYPEDEF && !strcmp(d->name, name))
            return d->decls->rel == REL_VECTOR;
    return 0;
}

static void member(FILE *f, const char *ind, const struct decl *d, const char *within)
{
    char addr[512], base[512];
    if (d->rel == REL_VECTOR || (d->rel == REL_ALIAS && !d->prefix && is_vector_typedef(d->type)))
        snprintf(addr, sizeof addr, "objp->%s%s", within, d->name);
    else
        snprintf(addr, sizeof addr, "&objp->%s%s", within, d->name);
    snprintf(base, sizeof base, "objp->%s%s.", within, d->name);
    xdr_stmt(f, ind, d, addr, base);
}

void gen_xdr(FILE *f, struct def *defs, const struct genopts *o)
{
    fprintf(f, "/*\n * Please do not edit this file.\n * It was generated using memlan-rpcgen.\n"
               " */\n\n#include \"%s\"\n\n",
            o->header);
    g_defs = defs;
    for (struct def *d = defs; d; d = d->next) {
        switch (d->kind) {
        case DEF_PASS:
            pass(f, d);
            continue;
        case DEF_CONST:
            continue;
        case DEF_PROGRAM:
            if (o->newstyle)
                argument_structs(f, d, ARG_XDR_FN);
            continue;
        case DEF_TYPEDEF:
            if (d->decls->rel == REL_VECTOR)
                fprintf(f, "bool_t\nxdr_%s (XDR *xdrs, %s objp)\n{\n", d->name, d->name);
            else
                fprintf(f, "bool_t\nxdr_%s (XDR *xdrs, %s *objp)\n{\n", d->name, d->name);
            xdr_stmt(f, "\t", d->decls, "objp", "objp->");
            break;
        case DEF_ENUM:
            fprintf(f, "bool_t\nxdr_%s (XDR *xdrs, %s *objp)\n{\n", d->name, d->name);
            fprintf(f, "\tif (!xdr_enum (xdrs, (enum_t *) objp))\n\t\treturn FALSE;\n");
            break;
        case DEF_STRUCT:
            fprintf(f, "bool_t\nxdr_%s (XDR *xdrs, %s *objp)\n{\n", d->name, d->name);
            for (int i = 0; i < d->ndecls; i++)
                member(f, "\t", &d->decls[i], "");
            break;
        case DEF_UNION: {
            fprintf(f, "bool_t\nxdr_%s (XDR *xdrs, %s *objp)\n{\n", d->name, d->name);
            member(f, "\t", &d->disc, "");
            fprintf(f, "\tswitch (objp->%s) {\n", d->disc.name);
            char within[300];
            snprintf(within, sizeof within, "%s_u.", d->name);
            for (int i = 0; i < d->ncases; i++) {
                for (int j = 0; j < d->cases[i].nvalues; j++)
                    fprintf(f, "\tcase %s:\n", d->cases[i].values[j]);
                member(f, "\t\t", &d->cases[i].arm, within);
                fprintf(f, "\t\tbreak;\n");
            }
            if (d->deflt) {
                fprintf(f, "\tdefault:\n");
                member(f, "\t\t", d->deflt, within);
                fprintf(f, "\t\tbreak;\n");
            } else {
                fprintf(f, "\tdefault:\n\t\treturn FALSE;\n");
            }
            fprintf(f, "\t}\n");
            break;
        }
        }
        fprintf(f, "\treturn TRUE;\n}\n\n");
    }
}

/* ---- client stubs ----------------------------------------------------------------------- */

void gen_clnt(FILE *f, struct def *defs, const struct genopts *o)
{
    fprintf(f, "/*\n * Please do not edit this file.\n * It was generated using memlan-rpcgen.\n"
               " */\n\n#include <memory.h> /* for memset */\n#include \"%s\"\n\n",
            o->header);
    for (struct def *d = defs; d; d = d->next)
        if (d->kind == DEF_PASS)
            pass(f, d);
    int progs = 0;
    for (struct def *d = defs; d; d = d->next)
        progs += d->kind == DEF_PROGRAM;
    if (progs)
        fprintf(f, "/* Default timeout can be changed using clnt_control() */\n"
                   "static struct timeval TIMEOUT = { 25, 0 };\n\n");
    for (struct def *d = defs; d; d = d->next) {
        if (d->kind != DEF_PROGRAM)
            continue;
        for (int v = 0; v < d->nvers; v++) {
            const struct version *ve = &d->vers[v];
            for (int i = 0; i < ve->nprocs; i++) {
                const struct proc *pr = &ve->procs[i];
                char *ln = lower(pr->name);
                const struct decl *a = &pr->args[0], *r = &pr->res;
                int avoid = !strcmp(a->type, "void"), rvoid = !strcmp(r->type, "void");
                const char *at = ptype(a);
                char rt[300];
                snprintf(rt, sizeof rt, "%s", ptype(r));
                if (o->newstyle) {
                    if (o->mt)
                        fprintf(f, "enum clnt_stat \n%s_%s(", ln, ve->number);
                    else
                        fprintf(f, "%s *\n%s_%s(", rt, ln, ve->number);
                    value_params(f, pr, 1);
                    if (o->mt)
                        fprintf(f, "%s *clnt_res, ", rt);
                    fprintf(f, " CLIENT *clnt)\n{\n");
                    if (multi(pr))
                        fprintf(f, "\t%s arg;\n", wire_arg_type(pr, ln, ve->number));
                    if (!o->mt)
                        fprintf(f, "\tstatic %s clnt_res;\n\n"
                                   "\tmemset((char *)&clnt_res, 0, sizeof(clnt_res));\n",
                                rvoid ? "char" : rt);
                    for (int k = 0; multi(pr) && k < pr->nargs; k++)
                        fprintf(f, "\targ.arg%d = arg%d;\n", k + 1, k + 1);
                    fprintf(f, "\t%s (clnt_call (clnt, %s,\n\t\t(xdrproc_t) %s, (caddr_t) %s,\n"
                               "\t\t(xdrproc_t) %s, (caddr_t) %sclnt_res,\n\t\tTIMEOUT)%s",
                            o->mt ? "return" : "if", pr->name, wire_arg_xdr(pr, ln, ve->number),
                            multi(pr) ? "&arg" : avoid ? "NULL" : "&arg1",
                            rvoid ? XVOID : xdrfn(r), o->mt ? "" : "&",
                            o->mt ? ");\n}\n\n" : " != RPC_SUCCESS) {\n\t\treturn (NULL);\n\t}\n");
                    if (!o->mt)
                        fprintf(f, "\treturn (%s&clnt_res);\n}\n\n", rvoid ? "(void *)" : "");
                } else if (o->mt) {
                    fprintf(f, "enum clnt_stat \n%s_%s(%s *argp, %s *clnt_res, CLIENT *clnt)\n{\n",
                            ln, ve->number, at, rt);
                    fprintf(f, "\treturn (clnt_call(clnt, %s,\n\t\t(xdrproc_t) %s, (caddr_t) "
                               "argp,\n\t\t(xdrproc_t) %s, (caddr_t) clnt_res,\n\t\tTIMEOUT));\n"
                               "}\n\n",
                            pr->name, avoid ? XVOID : xdrfn(a),
                            rvoid ? XVOID : xdrfn(r));
                } else {
                    fprintf(f, "%s *\n%s_%s(%s *argp, CLIENT *clnt)\n{\n", rt, ln, ve->number,
                            at);
                    fprintf(f, "\tstatic %s clnt_res;\n\n", rvoid ? "char" : rt);
                    fprintf(f, "\tmemset((char *)&clnt_res, 0, sizeof(clnt_res));\n");
                    fprintf(f, "\tif (clnt_call (clnt, %s,\n\t\t(xdrproc_t) %s, (caddr_t) argp,\n"
                               "\t\t(xdrproc_t) %s, (caddr_t) &clnt_res,\n\t\tTIMEOUT) != "
                               "RPC_SUCCESS) {\n\t\treturn (NULL);\n\t}\n",
                            pr->name, avoid ? XVOID : xdrfn(a),
                            rvoid ? XVOID : xdrfn(r));
                    fprintf(f, "\treturn (%s&clnt_res);\n}\n\n", rvoid ? "(void *)" : "");
                }
                free(ln);
            }
        }
    }
}

/* ---- server ----------------------------------------------------------------------------- */

static void svc_dispatch(FILE *f, const struct def *d, const struct version *ve, int with_main,
                         const struct genopts *o)
{
    char *lp = lower(d->name);
    for (int i = 0; o->newstyle && i < ve->nprocs; i++) {
        /* -N: the dispatcher's calling convention (argument by address) to the by-value one */
        const struct proc *pr = &ve->procs[i];
        char *ln = lower(pr->name);
        if (o->mt)
            fprintf(f, "static bool_t\n_%s_%s (%s *argp, void *result, struct svc_req *rqstp)\n{\n",
                    ln, ve->number, wire_arg_type(pr, ln, ve->number));
        else
            fprintf(f, "static %s *\n_%s_%s (%s *argp, struct svc_req *rqstp)\n{\n",
                    ptype(&pr->res), ln, ve->number, wire_arg_type(pr, ln, ve->number));
        if (noarg(pr))
            fprintf(f, "\t(void)argp;\n");
        fprintf(f, "\treturn (%s_%s_svc(", ln, ve->number);
        for (int k = 0; !noarg(pr) && k < pr->nargs; k++)
            if (multi(pr))
                fprintf(f, "argp->arg%d, ", k + 1);
            else
                fprintf(f, "*argp, ");
        fprintf(f, "%srqstp));\n}\n\n", o->mt ? "result, " : "");
        free(ln);
    }
    fprintf(f, "%svoid\n%s_%s(struct svc_req *rqstp, register SVCXPRT *transp)\n{\n",
            with_main ? "static " : "", lp, ve->number);
    int nargs = 0, nres = 0;
    for (int i = 0; i < ve->nprocs; i++) {
        nargs += strcmp(ve->procs[i].args[0].type, "void") != 0;
        nres += strcmp(ve->procs[i].res.type, "void") != 0;
    }
    fprintf(f, "\tunion {\n");
    for (int i = 0; i < ve->nprocs; i++) {
        const struct proc *pr = &ve->procs[i];
        if (strcmp(pr->args[0].type, "void")) {
            char *ln = lower(pr->name);
            fprintf(f, "\t\t%s %s_%s_arg;\n", wire_arg_type(pr, ln, ve->number), ln,
                    ve->number);
            free(ln);
        }
    }
    if (!nargs)
        fprintf(f, "\t\tint fill;\n");
    fprintf(f, "\t} argument;\n");
    if (o->mt) {
        fprintf(f, "\tunion {\n");
        for (int i = 0; i < ve->nprocs; i++) {
            const struct proc *pr = &ve->procs[i];
            if (strcmp(pr->res.type, "void")) {
                char *ln = lower(pr->name);
                fprintf(f, "\t\t%s %s_%s_res;\n", ptype(&pr->res), ln, ve->number);
                free(ln);
            }
        }
        if (!nres)
            fprintf(f, "\t\tint fill;\n");
        fprintf(f, "\t} result;\n\tbool_t retval;\n");
        fprintf(f, "\txdrproc_t _xdr_argument, _xdr_result;\n"
                   "\tbool_t (*local)(char *, void *, struct svc_req *);\n\n");
    } else {
        fprintf(f, "\tchar *result;\n\txdrproc_t _xdr_argument, _xdr_result;\n"
                   "\tchar *(*local)(char *, struct svc_req *);\n\n");
    }
    fprintf(f, "\tswitch (rqstp->rq_proc) {\n");
    for (int i = 0; i < ve->nprocs; i++) {
        const struct proc *pr = &ve->procs[i];
        char *ln = lower(pr->name);
        int avoid = !strcmp(pr->args[0].type, "void"), rvoid = !strcmp(pr->res.type, "void");
        (void)avoid;
        fprintf(f, "\tcase %s:\n\t\t_xdr_argument = (xdrproc_t) %s;\n"
                   "\t\t_xdr_result = (xdrproc_t) %s;\n",
                pr->name, wire_arg_xdr(pr, ln, ve->number), rvoid ? XVOID : xdrfn(&pr->res));
        const char *fn = o->newstyle ? xprintf("_%s_%s", ln, ve->number)
                                     : xprintf("%s_%s_svc", ln, ve->number);
        if (o->mt)
            fprintf(f, "\t\tlocal = (bool_t (*) (char *, void *,  struct svc_req *))%s;\n", fn);
        else
            fprintf(f, "\t\tlocal = (char *(*)(char *, struct svc_req *)) %s;\n", fn);
        free((char *)fn);
        fprintf(f, "\t\tbreak;\n\n");
        free(ln);
    }
    fprintf(f, "\tdefault:\n\t\tsvcerr_noproc (transp);\n\t\treturn;\n\t}\n"
               "\tmemset ((char *)&argument, 0, sizeof (argument));\n"
               "\tif (!svc_getargs (transp, (xdrproc_t) _xdr_argument, (caddr_t) &argument)) {\n"
               "\t\tsvcerr_decode (transp);\n\t\treturn;\n\t}\n");
    if (o->mt)
        fprintf(f, "\tretval = (bool_t) (*local)((char *)&argument, (void *)&result, rqstp);\n"
                   "\tif (retval > 0 && !svc_sendreply(transp, (xdrproc_t) _xdr_result, (char "
                   "*)&result)) {\n\t\tsvcerr_systemerr (transp);\n\t}\n");
    else
        fprintf(f, "\tresult = (*local)((char *)&argument, rqstp);\n"
                   "\tif (result != NULL && !svc_sendreply(transp, (xdrproc_t) _xdr_result, "
                   "result)) {\n\t\tsvcerr_systemerr (transp);\n\t}\n");
    fprintf(f, "\tif (!svc_freeargs (transp, (xdrproc_t) _xdr_argument, (caddr_t) &argument)) {\n"
               "\t\tfprintf (stderr, \"%%s\", \"unable to free arguments\");\n\t\texit (1);\n\t}\n");
    if (o->mt)
        fprintf(f, "\tif (!%s_%s_freeresult (transp, _xdr_result, (caddr_t) &result))\n"
                   "\t\tfprintf (stderr, \"%%s\", \"unable to free results\");\n\n",
                lp, ve->number);
    fprintf(f, "\treturn;\n}\n\n");
    free(lp);
}

void gen_svc(FILE *f, struct def *defs, const struct genopts *o, int with_main)
{
    fprintf(f, "/*\n * Please do not edit this file.\n * It was generated using memlan-rpcgen.\n"
               " */\n\n#include \"%s\"\n#include <stdio.h>\n#include <stdlib.h>\n"
               "#include <rpc/pmap_clnt.h>\n#include <string.h>\n#include <memory.h>\n"
               "#include <sys/socket.h>\n#include <netinet/in.h>\n%s\n"
               "#ifndef SIG_PF\n#define SIG_PF void(*)(int)\n#endif\n\n",
            o->header, o->timeout_secs ? "#include <signal.h>\n#include <unistd.h>\n" : "");
    for (struct def *d = defs; d; d = d->next)
        if (d->kind == DEF_PASS)
            pass(f, d);
    for (struct def *d = defs; d; d = d->next)
        if (d->kind == DEF_PROGRAM)
            for (int v = 0; v < d->nvers; v++)
                svc_dispatch(f, d, &d->vers[v], with_main, o);
    if (!with_main)
        return;
    if (o->timeout_secs)
        fprintf(f, "static void\n_msgout_exit (int sig)\n{\n\t(void)sig;\n\t_exit (0);\n}\n\n");
    fprintf(f, "int\nmain (int argc, char **argv)\n{\n\tregister SVCXPRT *transp;\n\n"
               "\t(void)argc;\n\t(void)argv;\n");
    for (struct def *d = defs; d; d = d->next)
        if (d->kind == DEF_PROGRAM)
            for (int v = 0; v < d->nvers; v++)
                fprintf(f, "\tpmap_unset (%s, %s);\n", d->name, d->vers[v].name);
    fprintf(f, "\n");
    for (int n = 0; n < o->nnettypes; n++) {
        int udp = !strcmp(o->nettypes[n], "udp");
        fprintf(f, "\ttransp = %s;\n\tif (transp == NULL) {\n"
                   "\t\tfprintf (stderr, \"%%s\", \"cannot create %s service.\");\n"
                   "\t\texit(1);\n\t}\n",
                udp ? "svcudp_create(RPC_ANYSOCK)" : "svctcp_create(RPC_ANYSOCK, 0, 0)",
                o->nettypes[n]);
        for (struct def *d = defs; d; d = d->next) {
            if (d->kind != DEF_PROGRAM)
                continue;
            char *lp = lower(d->name);
            for (int v = 0; v < d->nvers; v++)
                fprintf(f, "\tif (!svc_register(transp, %s, %s, %s_%s, %s)) {\n"
                           "\t\tfprintf (stderr, \"%%s\", \"unable to register (%s, %s, %s).\");\n"
                           "\t\texit(1);\n\t}\n",
                        d->name, d->vers[v].name, lp, d->vers[v].number,
                        udp ? "IPPROTO_UDP" : "IPPROTO_TCP", d->name, d->vers[v].name,
                        o->nettypes[n]);
            free(lp);
        }
        fprintf(f, "\n");
    }
    if (o->timeout_secs)
        fprintf(f, "\tsignal (SIGALRM, _msgout_exit);\n\talarm (%d);\n", o->timeout_secs);
    fprintf(f, "\tsvc_run ();\n\tfprintf (stderr, \"%%s\", \"svc_run returned\");\n\texit (1);\n"
               "\t/* NOTREACHED */\n}\n");
}

/* ---- main ------------------------------------------------------------------------------- */

/* The Makefile passes include/memlan.h's version; a build of this file alone (the fuzz test's)
 * says so instead. */
#ifndef MEMLAN_RPCGEN_VERSION
#define MEMLAN_RPCGEN_VERSION "(version unknown: built outside the Makefile)"
#endif

/* The usage on stdout for --help (exit 0), on stderr after an error (exit 1, as rpcgen). */
static void usage_to(FILE *f, int status)
{
    fprintf(f,
            "usage: memlan-rpcgen [-CLMb] [-Dname[=value]] [-K secs] [-i size] [-Y path] infile\n"
            "       memlan-rpcgen [-c | -h | -l | -m] [-M] [-o outfile] infile\n"
            "       memlan-rpcgen [-s nettype]* [-o outfile] infile\n"
            "Generates rpcgen's interface with memlan's shared-memory fast path.\n"
            "  -h header  -c XDR routines  -l client stubs  -m server skeleton (no main)\n"
            "  -s tcp|udp server with main for that transport (repeatable)\n"
            "  -M MT-safe stubs  -N arguments by value, several allowed\n"
            "  -o output file  -D define for #if\n"
            "  with no -h/-c/-l/-m/-s: all four files (NAME.h, NAME_xdr.c, NAME_clnt.c, "
            "NAME_svc.c)\n"
            "  --help, --version\n");
    exit(status);
}

static void usage(void) { usage_to(stderr, 1); }

/* What was wrong, then the usage. */
static void usage_error(const char *fmt, const char *what)
{
    fprintf(stderr, "memlan-rpcgen: ");
    fprintf(stderr, fmt, what);
    fputc('\n', stderr);
    usage();
}

static FILE *open_out(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    return f;
}

static void close_out(FILE *f, const char *path)
{
    if (ferror(f) || fclose(f) != 0) {
        fprintf(stderr, "memlan-rpcgen: writing %s failed\n", path);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    int mode = 0; /* 'h', 'c', 'l', 'm', 's' or 0 = all */
    const char *out = NULL, *in = NULL;
    struct genopts o = {0};
    struct defines defs = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0)
            usage_to(stdout, 0);
        if (strcmp(a, "--version") == 0) {
            printf("memlan-rpcgen %s\n", MEMLAN_RPCGEN_VERSION);
            return 0;
        }
        if (a[0] == '-' && a[1] == '-')
            usage_error("unknown option '%s'", a);
        if (a[0] != '-' || !a[1]) {
            if (in)
                usage_error("one input file only: '%s' is a second", a);
            in = a;
            continue;
        }
        for (int j = 1; a[j]; j++) {
            char c = a[j];
            const char *val = NULL;
            if (strchr("oDsnKiYS", c)) {
                val = a[j + 1] ? a + j + 1 : (i + 1 < argc ? argv[++i] : NULL);
                if (!val)
                    usage_error("option -%s needs a value", (char[]){c, 0});
            }
            switch (c) {
            case 'h': case 'c': case 'l': case 'm':
                if (mode && mode != c)
                    usage();
                mode = c;
                break;
            case 't':
            case 'T':
            case 'a':
            case 'I':
            case '5':
                fprintf(stderr, "memlan-rpcgen: -%c is not supported\n", c);
                return 1;
            case 'S':
                fprintf(stderr, "memlan-rpcgen: -S%s (sample code) is not supported\n", val);
                return 1;
            case 'C': case 'L': case 'b': case 'k':
                break; /* ANSI C is the only mode; errors go to stderr */
            case 'M':
                o.mt = 1;
                break;
            case 'N':
                o.newstyle = 1;
                break;
            case 'o':
                out = val;
                break;
            case 'D': {
                const char *eq = strchr(val, '=');
                char *name = eq ? xprintf("%.*s", (int)(eq - val), val) : xstrdup(val);
                defs.names = realloc(defs.names, sizeof(char *) * (size_t)(defs.n + 1));
                defs.values = realloc(defs.values, sizeof(char *) * (size_t)(defs.n + 1));
                if (!defs.names || !defs.values)
                    usage();
                defs.names[defs.n] = name;
                defs.values[defs.n++] = xstrdup(eq ? eq + 1 : "1");
                break;
            }
            case 's':
            case 'n':
                if (strcmp(val, "tcp") && strcmp(val, "udp")) {
                    fprintf(stderr, "memlan-rpcgen: nettype %s: only tcp and udp\n", val);
                    return 1;
                }
                if (mode && mode != 's')
                    usage();
                mode = 's';
                o.nettypes = realloc(o.nettypes, sizeof(char *) * (size_t)(o.nnettypes + 1));
                if (!o.nettypes)
                    usage();
                o.nettypes[o.nnettypes++] = (char *)val;
                break;
            case 'K': {
                char *end;
                long secs = strtol(val, &end, 10);
                if (*end || end == val || secs < -1 || secs > INT_MAX)
                    usage_error("bad value '%s' for -K: seconds, or -1", val);
                o.timeout_secs = (int)secs;
                break;
            }
            case 'i':
            case 'Y':
                break; /* no inline code; no cpp */
            default:
                usage_error("unknown option '-%s'", (char[]){c, 0});
            }
            if (val)
                break;
        }
    }
    if (!in)
        usage_error("%s", "no input file");
    size_t inl = strlen(in);
    if (inl < 3 || strcmp(in + inl - 2, ".x") != 0) {
        fprintf(stderr, "memlan-rpcgen: %s: the input file's name must end in .x\n", in);
        return 1;
    }
    /* outputs go to the current directory, named after the input's base name, as rpcgen does */
    const char *base = strrchr(in, '/');
    base = base ? base + 1 : in;
    char *stem = xprintf("%.*s", (int)(strlen(base) - 2), base);
    char *hdr = xprintf("%s.h", stem);
    o.header = hdr;
    if (mode == 'h' && out) {
        const char *ob = strrchr(out, '/');
        o.header = ob ? ob + 1 : out;
    }
    char *g = xprintf("_%s_H_RPCGEN", o.header);
    for (char *q = g; *q; q++)
        *q = isalnum((unsigned char)*q) ? (char)toupper((unsigned char)*q) : '_';
    /* rpcgen's guard drops the header's ".h": _NAME_H_RPCGEN */
    char *dot = strstr(g, "_H_H_RPCGEN");
    if (dot)
        memmove(dot, dot + 2, strlen(dot + 2) + 1);
    o.guard = g;

    const char *sym[] = {"RPC_HDR", "RPC_XDR", "RPC_CLNT", "RPC_SVC"};
    const int modes[] = {'h', 'c', 'l', 'm'};
    for (int k = 0; k < 4; k++) {
        int m = modes[k];
        int want = mode == 0 || mode == m || (mode == 's' && m == 'm');
        if (!want)
            continue;
        struct defines d2 = defs;
        d2.names = xmalloc(sizeof(char *) * (size_t)(defs.n + 1));
        d2.values = xmalloc(sizeof(char *) * (size_t)(defs.n + 1));
        if (defs.n) { /* without -D, defs.names is NULL: memcpy(dst, NULL, 0) is undefined */
            memcpy(d2.names, defs.names, sizeof(char *) * (size_t)defs.n);
            memcpy(d2.values, defs.values, sizeof(char *) * (size_t)defs.n);
        }
        d2.names[d2.n] = xstrdup(sym[k]);
        d2.values[d2.n++] = xstrdup("1");
        struct def *tree = rpcgen_parse(in, &d2);
        for (struct def *d = tree; d && !o.newstyle; d = d->next)
            for (int v = 0; d->kind == DEF_PROGRAM && v < d->nvers; v++)
                for (int i = 0; i < d->vers[v].nprocs; i++)
                    if (multi(&d->vers[v].procs[i]))
                        fatal_at(d->vers[v].procs[i].args[1].at,
                                 "procedure %s takes %d arguments: several arguments need -N",
                                 d->vers[v].procs[i].name, d->vers[v].procs[i].nargs);
        char *path;
        if (out)
            path = xstrdup(out);
        else if (m == 'h')
            path = xstrdup(hdr);
        else
            path = xprintf("%s_%s.c", stem, m == 'c' ? "xdr" : m == 'l' ? "clnt" : "svc");
        FILE *f = strcmp(path, "-") == 0 ? stdout : open_out(path);
        if (m == 'h')
            gen_header(f, tree, &o);
        else if (m == 'c')
            gen_xdr(f, tree, &o);
        else if (m == 'l')
            gen_clnt(f, tree, &o);
        else {
            if (mode == 0 && !o.nnettypes) {
                static char *both[] = {"udp", "tcp"};
                o.nettypes = both;
                o.nnettypes = 2;
            }
            gen_svc(f, tree, &o, mode != 'm');
        }
        if (f == stdout)
            fflush(f);
        else
            close_out(f, path);
    }
    return 0;
}
