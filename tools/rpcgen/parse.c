/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * memlan-rpcgen's front end: a small preprocessor (#define, #undef, #if/#ifdef/#ifndef/#elif/
 * #else/#endif, #include "file"), a lexer that keeps file, line and column, and a recursive
 * descent parser for the RPC language of RFC 5531 section 12 with rpcgen's extensions (char,
 * short, long, unsigned alone, "struct name" references, % pass-through lines).  It keeps
 * columns exact because it does not run cpp: every error points at the character.
 */
#include "rpcgen.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

void *xmalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        fprintf(stderr, "memlan-rpcgen: out of memory\n");
        exit(1);
    }
    return p;
}

char *xstrdup(const char *s)
{
    char *p = xmalloc(strlen(s) + 1);
    strcpy(p, s);
    return p;
}

char *xprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *p = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

void fatal_at(struct loc at, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s:%d:%d: error: ", at.file ? at.file : "<input>", at.line, at.col);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

#define GROW(arr, n)                                                                    \
    do {                                                                                \
        if (((n) & ((n) - 1)) == 0) {                                                   \
            void *g_ = realloc((arr), sizeof(*(arr)) * ((n) ? 2 * (size_t)(n) : 1));    \
            if (!g_) {                                                                  \
                fprintf(stderr, "memlan-rpcgen: out of memory\n");                      \
                exit(1);                                                                \
            }                                                                           \
            (arr) = g_;                                                                 \
        }                                                                               \
    } while (0)

/* ---- sources and the preprocessor ------------------------------------------------------- */

struct src {
    char *name, *text;
    size_t pos;
    int line, col;
    int bol;            /* at the beginning of a line (only blanks seen) */
    int cond[64];       /* per #if level: 1 = taking, 0 = skipping, 2 = already taken */
    int outer[64];      /* whether the enclosing level was taking */
    int depth;
    struct src *up;
};

enum tk { TK_EOF, TK_ID, TK_NUM, TK_STR, TK_PUNCT, TK_PASS };

struct tok {
    enum tk kind;
    char *text;
    struct loc at;
};

struct parser {
    struct src *src;
    struct defines *defs;
    struct tok cur;
    int have;
    struct def *head, **tail;
    char **names; /* every defined type name, for checks */
    int *nkinds;
    int nnames;
};

/* Input files are bounded: one file at most RPCGEN_FILE_MAX bytes, every file of a run
 * together (includes are re-read once per output) at most RPCGEN_TOTAL_MAX, and only regular
 * files (a FIFO, a terminal or /dev/zero would block or never end). */
#define RPCGEN_FILE_MAX (16u << 20)
#define RPCGEN_TOTAL_MAX (256u << 20)
static size_t rpcgen_total_read;

static void cannot_read(const char *path, struct loc from, const char *why)
{
    if (from.file)
        fatal_at(from, "cannot read %s: %s", path, why);
    fprintf(stderr, "memlan-rpcgen: cannot read %s: %s\n", path, why);
    exit(1);
}

static char *read_file(const char *path, struct loc from)
{
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        cannot_read(path, from, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0)
        cannot_read(path, from, strerror(errno));
    if (!S_ISREG(st.st_mode))
        cannot_read(path, from, "not a regular file");
    if ((unsigned long long)st.st_size > RPCGEN_FILE_MAX)
        cannot_read(path, from, "larger than 16 MiB");
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *buf = xmalloc(cap);
    while (n < cap - 1) { /* bounded: at most st_size bytes, even if the file grows */
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            cannot_read(path, from, strerror(errno));
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    rpcgen_total_read += n;
    if (rpcgen_total_read > RPCGEN_TOTAL_MAX)
        cannot_read(path, from, "more than 256 MiB of input in all (an #include loop?)");
    buf[n] = 0;
    if (memchr(buf, 0, n))
        fatal_at((struct loc){path, 1, 1}, "binary data (a NUL byte) in the input");
    return buf;
}

static void push_src(struct parser *p, const char *path, struct loc from)
{
    int depth = 0;
    for (struct src *s = p->src; s; s = s->up)
        if (++depth > 32)
            fatal_at(from, "#include nested too deeply (a loop?)");
    struct src *s = xmalloc(sizeof *s);
    s->name = xstrdup(path);
    s->text = read_file(path, from);
    s->line = 1;
    s->col = 1;
    s->bol = 1;
    s->cond[0] = 1;
    s->outer[0] = 1;
    s->up = p->src;
    p->src = s;
}

static int src_taking(const struct src *s)
{
    return s->cond[s->depth] == 1;
}

static const char *define_lookup(struct parser *p, const char *name)
{
    for (int i = p->defs->n - 1; i >= 0; i--)
        if (p->defs->names[i] && strcmp(p->defs->names[i], name) == 0)
            return p->defs->values[i];
    return NULL;
}

static void define_set(struct parser *p, const char *name, const char *value)
{
    struct defines *d = p->defs;
    GROW(d->names, d->n);
    GROW(d->values, d->n);
    d->names[d->n] = xstrdup(name);
    d->values[d->n] = xstrdup(value ? value : "1");
    d->n++;
}

static void define_unset(struct parser *p, const char *name)
{
    for (int i = 0; i < p->defs->n; i++)
        if (p->defs->names[i] && strcmp(p->defs->names[i], name) == 0)
            p->defs->names[i] = NULL;
}

/* #if expressions: numbers, names (defined -> their value, else 0), defined(X), !, &&, ||,
 * ==, !=, parentheses. */
struct cexpr {
    struct parser *p;
    const char *s;
    struct loc at;
};

static void cx_blank(struct cexpr *c)
{
    while (*c->s == ' ' || *c->s == '\t')
        c->s++;
}

static long cx_or(struct cexpr *c);

static long cx_unary(struct cexpr *c)
{
    cx_blank(c);
    if (*c->s == '!') {
        c->s++;
        return !cx_unary(c);
    }
    if (*c->s == '(') {
        c->s++;
        long v = cx_or(c);
        cx_blank(c);
        if (*c->s != ')')
            fatal_at(c->at, "missing ')' in #if expression");
        c->s++;
        return v;
    }
    if (isdigit((unsigned char)*c->s)) {
        char *end;
        long v = strtol(c->s, &end, 0);
        c->s = end;
        while (*c->s == 'u' || *c->s == 'U' || *c->s == 'l' || *c->s == 'L')
            c->s++;
        return v;
    }
    if (isalpha((unsigned char)*c->s) || *c->s == '_') {
        const char *b = c->s;
        while (isalnum((unsigned char)*c->s) || *c->s == '_')
            c->s++;
        char *name = xprintf("%.*s", (int)(c->s - b), b);
        if (strcmp(name, "defined") == 0) {
            cx_blank(c);
            int paren = *c->s == '(';
            if (paren)
                c->s++;
            cx_blank(c);
            b = c->s;
            while (isalnum((unsigned char)*c->s) || *c->s == '_')
                c->s++;
            if (c->s == b)
                fatal_at(c->at, "defined without a name in #if");
            char *n2 = xprintf("%.*s", (int)(c->s - b), b);
            cx_blank(c);
            if (paren) {
                if (*c->s != ')')
                    fatal_at(c->at, "missing ')' after defined(%s", n2);
                c->s++;
            }
            long v = define_lookup(c->p, n2) != NULL;
            free(n2);
            free(name);
            return v;
        }
        const char *val = define_lookup(c->p, name);
        free(name);
        if (!val)
            return 0;
        char *end;
        long v = strtol(val, &end, 0);
        return *val && *end == 0 ? v : 1;
    }
    fatal_at(c->at, "cannot read this #if expression at \"%s\"", c->s);
}

static long cx_eq(struct cexpr *c)
{
    long v = cx_unary(c);
    for (;;) {
        cx_blank(c);
        if (c->s[0] == '=' && c->s[1] == '=') {
            c->s += 2;
            v = v == cx_unary(c);
        } else if (c->s[0] == '!' && c->s[1] == '=') {
            c->s += 2;
            v = v != cx_unary(c);
        } else {
            return v;
        }
    }
}

static long cx_and(struct cexpr *c)
{
    long v = cx_eq(c);
    for (;;) {
        cx_blank(c);
        if (c->s[0] == '&' && c->s[1] == '&') {
            c->s += 2;
            long w = cx_eq(c);
            v = v && w;
        } else {
            return v;
        }
    }
}

static long cx_or(struct cexpr *c)
{
    long v = cx_and(c);
    for (;;) {
        cx_blank(c);
        if (c->s[0] == '|' && c->s[1] == '|') {
            c->s += 2;
            long w = cx_and(c);
            v = v || w;
        } else {
            return v;
        }
    }
}

/* Take a directive line (s->pos at the '#'); leaves s->pos at the end of the line. */
static void directive(struct parser *p)
{
    struct src *s = p->src;
    struct loc at = {s->name, s->line, s->col};
    const char *l = s->text + s->pos + 1;
    const char *eol = strchr(l, '\n');
    size_t len = eol ? (size_t)(eol - l) : strlen(l);
    char *line = xprintf("%.*s", (int)len, l);
    /* strip comments */
    char *cm = strstr(line, "/*");
    if (cm) {
        char *ce = strstr(cm + 2, "*/");
        if (ce && ce[2] == 0)
            *cm = 0;
        else if (!ce)
            fatal_at(at, "a comment that starts on a directive line must end on it");
        else
            *cm = 0;
    }
    if ((cm = strstr(line, "//")))
        *cm = 0;
    s->pos += 1 + len;
    s->col += (int)(1 + len);
    char *q = line;
    while (*q == ' ' || *q == '\t')
        q++;
    char *kw = q;
    while (isalpha((unsigned char)*q))
        q++;
    char *kwend = q;
    while (*q == ' ' || *q == '\t')
        q++;
    char *arg = q;
    size_t al = strlen(arg);
    while (al && (arg[al - 1] == ' ' || arg[al - 1] == '\t' || arg[al - 1] == '\r'))
        arg[--al] = 0;
    *kwend = 0;
    int taking = src_taking(s);

    if (strcmp(kw, "ifdef") == 0 || strcmp(kw, "ifndef") == 0 || strcmp(kw, "if") == 0) {
        if (s->depth + 1 >= 64)
            fatal_at(at, "#if nested too deeply");
        long v;
        if (kw[2] == 0) {
            struct cexpr c = {p, arg, at};
            v = taking ? cx_or(&c) : 0;
            cx_blank(&c);
            if (taking && *c.s)
                fatal_at(at, "unexpected \"%s\" in #if expression", c.s);
        } else {
            if (!*arg)
                fatal_at(at, "#%s needs a name", kw);
            v = define_lookup(p, arg) != NULL;
            if (kw[2] == 'n')
                v = !v;
        }
        s->depth++;
        s->outer[s->depth] = taking;
        s->cond[s->depth] = taking ? (v ? 1 : 0) : 2;
    } else if (strcmp(kw, "elif") == 0) {
        if (s->depth == 0)
            fatal_at(at, "#elif without #if");
        if (s->cond[s->depth] == 0 && s->outer[s->depth]) {
            struct cexpr c = {p, arg, at};
            s->cond[s->depth] = cx_or(&c) ? 1 : 0;
        } else {
            s->cond[s->depth] = 2;
        }
    } else if (strcmp(kw, "else") == 0) {
        if (s->depth == 0)
            fatal_at(at, "#else without #if");
        s->cond[s->depth] = (s->cond[s->depth] == 0 && s->outer[s->depth]) ? 1 : 2;
    } else if (strcmp(kw, "endif") == 0) {
        if (s->depth == 0)
            fatal_at(at, "#endif without #if");
        s->depth--;
    } else if (!taking) {
        /* other directives in a skipped region are ignored, as cpp does */
    } else if (strcmp(kw, "define") == 0) {
        char *n = arg;
        while (isalnum((unsigned char)*n) || *n == '_')
            n++;
        if (n == arg)
            fatal_at(at, "#define needs a name");
        if (*n == '(')
            fatal_at(at, "function-like macros are not supported in .x files");
        char *v = n;
        while (*v == ' ' || *v == '\t')
            v++;
        *n = 0;
        define_set(p, arg, *v ? v : "");
    } else if (strcmp(kw, "undef") == 0) {
        define_unset(p, arg);
    } else if (strcmp(kw, "include") == 0) {
        if (arg[0] != '"' || al < 2 || arg[al - 1] != '"')
            fatal_at(at, "#include needs a \"file\" (system headers do not belong in a .x file)");
        arg[al - 1] = 0;
        const char *inc = arg + 1;
        char *path;
        const char *slash = strrchr(s->name, '/');
        if (inc[0] != '/' && slash)
            path = xprintf("%.*s/%s", (int)(slash - s->name), s->name, inc);
        else
            path = xstrdup(inc);
        if (access(path, F_OK) != 0) { /* not beside the including file: as given */
            free(path);
            path = xstrdup(inc);
        }
        push_src(p, path, at);
        free(path);
    } else if (strcmp(kw, "pragma") == 0 || strcmp(kw, "ident") == 0 || *kw == 0) {
        /* ignored */
    } else if (strcmp(kw, "error") == 0) {
        fatal_at(at, "#error %s", arg);
    } else {
        fatal_at(at, "unknown directive #%s", kw);
    }
    free(line);
}

/* ---- lexer ------------------------------------------------------------------------------ */

static int peekc(struct src *s)
{
    return (unsigned char)s->text[s->pos];
}

static void advance(struct src *s)
{
    if (s->text[s->pos] == '\n') {
        s->line++;
        s->col = 1;
        s->bol = 1;
    } else {
        s->col++;
        if (s->text[s->pos] != ' ' && s->text[s->pos] != '\t' && s->text[s->pos] != '\r')
            s->bol = 0;
    }
    s->pos++;
}

static void lex_raw(struct parser *p, struct tok *t)
{
    for (;;) {
        struct src *s = p->src;
        if (!s) {
            t->kind = TK_EOF;
            t->text = xstrdup("end of input");
            return;
        }
        int c = peekc(s);
        if (c == 0) {
            if (s->depth)
                fatal_at((struct loc){s->name, s->line, s->col}, "missing #endif");
            p->src = s->up;
            if (!p->src) {
                t->kind = TK_EOF;
                t->text = xstrdup("end of input");
                t->at = (struct loc){s->name, s->line, s->col};
                return;
            }
            continue;
        }
        if (s->bol && c == '#') {
            directive(p);
            continue;
        }
        if (!src_taking(s)) {
            while (peekc(s) && peekc(s) != '\n')
                advance(s);
            if (peekc(s))
                advance(s);
            continue;
        }
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v') {
            advance(s);
            continue;
        }
        struct loc at = {s->name, s->line, s->col};
        if (c == '/' && s->text[s->pos + 1] == '*') {
            advance(s);
            advance(s);
            while (peekc(s) && !(peekc(s) == '*' && s->text[s->pos + 1] == '/'))
                advance(s);
            if (!peekc(s))
                fatal_at(at, "unterminated comment");
            int bol = s->bol;
            advance(s);
            advance(s);
            s->bol = bol;
            continue;
        }
        if (c == '/' && s->text[s->pos + 1] == '/') {
            while (peekc(s) && peekc(s) != '\n')
                advance(s);
            continue;
        }
        t->at = at;
        if (c == '%' && s->bol) {
            advance(s);
            size_t b = s->pos;
            /* a line ending in a backslash goes on on the next, as cpp would join it */
            while (peekc(s) && (peekc(s) != '\n' || (s->pos > b && s->text[s->pos - 1] == '\\')))
                advance(s);
            t->kind = TK_PASS;
            t->text = xprintf("%.*s", (int)(s->pos - b), s->text + b);
            return;
        }
        if (isalpha(c) || c == '_') {
            size_t b = s->pos;
            while (isalnum(peekc(s)) || peekc(s) == '_')
                advance(s);
            t->kind = TK_ID;
            t->text = xprintf("%.*s", (int)(s->pos - b), s->text + b);
            return;
        }
        if (isdigit(c) || (c == '-' && isdigit((unsigned char)s->text[s->pos + 1]))) {
            size_t b = s->pos;
            advance(s);
            while (isalnum(peekc(s)))
                advance(s);
            t->kind = TK_NUM;
            t->text = xprintf("%.*s", (int)(s->pos - b), s->text + b);
            char *end;
            errno = 0;
            const char *digits = t->text[0] == '-' ? t->text + 1 : t->text;
            (void)strtoull(digits, &end, 0);
            if (*end || errno)
                fatal_at(at, "bad number \"%s\"", t->text);
            return;
        }
        if (c == '"') {
            size_t b = s->pos;
            advance(s);
            while (peekc(s) && peekc(s) != '"' && peekc(s) != '\n') {
                if (peekc(s) == '\\' && s->text[s->pos + 1] && s->text[s->pos + 1] != '\n')
                    advance(s);
                advance(s);
            }
            if (peekc(s) != '"')
                fatal_at(at, "unterminated string");
            advance(s);
            t->kind = TK_STR;
            t->text = xprintf("%.*s", (int)(s->pos - b), s->text + b);
            return;
        }
        if (strchr("{}()[]<>;,=:*", c)) {
            advance(s);
            t->kind = TK_PUNCT;
            t->text = xprintf("%c", c);
            return;
        }
        if (isprint(c))
            fatal_at(at, "unexpected character '%c'", c);
        fatal_at(at, "unexpected byte 0x%02x", c);
    }
}

static void lex(struct parser *p, struct tok *t)
{
    lex_raw(p, t);
    /* object-like macros: a name defined to one token becomes that token */
    for (int guard = 0; t->kind == TK_ID && guard < 16; guard++) {
        const char *v = define_lookup(p, t->text);
        if (!v || !*v || strcmp(v, t->text) == 0)
            return;
        const char *q = v;
        if (*q == '-')
            q++;
        int num = isdigit((unsigned char)*q), id = isalpha((unsigned char)*q) || *q == '_';
        for (const char *r = q; *r; r++)
            if (!(isalnum((unsigned char)*r) || *r == '_'))
                fatal_at(t->at, "macro %s expands to \"%s\", which is not one name or number",
                         t->text, v);
        if (!num && !id)
            return;
        t->text = xstrdup(v);
        t->kind = num ? TK_NUM : TK_ID;
    }
}

static struct tok *peek(struct parser *p)
{
    if (!p->have) {
        lex(p, &p->cur);
        p->have = 1;
    }
    return &p->cur;
}

static struct tok next(struct parser *p)
{
    struct tok t = *peek(p);
    p->have = 0;
    return t;
}

static int is(struct parser *p, const char *text)
{
    struct tok *t = peek(p);
    return (t->kind == TK_PUNCT || t->kind == TK_ID) && strcmp(t->text, text) == 0;
}

static int accept(struct parser *p, const char *text)
{
    if (is(p, text)) {
        next(p);
        return 1;
    }
    return 0;
}

static const char *describe(const struct tok *t)
{
    static char buf[96];
    if (t->kind == TK_EOF)
        return "end of input";
    if (t->kind == TK_PASS)
        return "a % line";
    snprintf(buf, sizeof buf, "\"%.80s\"", t->text);
    return buf;
}

static void expect(struct parser *p, const char *text, const char *what)
{
    struct tok *t = peek(p);
    if (!is(p, text))
        fatal_at(t->at, "expected '%s' %s, found %s", text, what, describe(t));
    next(p);
}

static const char *const reserved[] = {
    "bool", "case", "const", "default", "double", "quadruple", "enum", "float", "hyper", "int",
    "opaque", "program", "string", "struct", "switch", "typedef", "union", "unsigned", "version",
    "void", "char", "short", "long", NULL};

static int is_reserved(const char *s)
{
    for (int i = 0; reserved[i]; i++)
        if (strcmp(reserved[i], s) == 0)
            return 1;
    return 0;
}

static char *ident(struct parser *p, const char *what)
{
    struct tok *t = peek(p);
    if (t->kind != TK_ID)
        fatal_at(t->at, "expected %s, found %s", what, describe(t));
    if (is_reserved(t->text))
        fatal_at(t->at, "expected %s, found the keyword \"%s\"", what, t->text);
    return next(p).text;
}

/* a constant: a number or a name (a const or an enum value) */
static char *value(struct parser *p, const char *what)
{
    struct tok *t = peek(p);
    if (t->kind == TK_NUM)
        return next(p).text;
    if (t->kind == TK_ID && !is_reserved(t->text))
        return next(p).text;
    fatal_at(t->at, "expected %s (a number or a constant's name), found %s", what, describe(t));
}

/* ---- type names ------------------------------------------------------------------------- */

enum { K_STRUCT = 1, K_UNION, K_ENUM, K_TYPEDEF, K_CONST, K_PROC };

static int name_kind(struct parser *p, const char *name)
{
    for (int i = 0; i < p->nnames; i++)
        if (strcmp(p->names[i], name) == 0)
            return p->nkinds[i];
    return 0;
}

static void name_add(struct parser *p, const char *name, int kind, struct loc at)
{
    if (name_kind(p, name))
        fatal_at(at, "\"%s\" is defined twice", name);
    GROW(p->names, p->nnames);
    GROW(p->nkinds, p->nnames);
    p->names[p->nnames] = xstrdup(name);
    p->nkinds[p->nnames] = kind;
    p->nnames++;
}

/* type-specifier; fills d->type and d->prefix.  void_ok: "void" allowed here. */
static void type_spec(struct parser *p, struct decl *d, int void_ok)
{
    struct tok t = next(p);
    d->at = t.at;
    d->prefix = NULL;
    if (t.kind != TK_ID)
        fatal_at(t.at, "expected a type, found %s", describe(&t));
    const char *s = t.text;
    if (strcmp(s, "unsigned") == 0) {
        if (accept(p, "int"))
            d->type = "u_int";
        else if (accept(p, "hyper"))
            d->type = "u_quad_t";
        else if (accept(p, "long"))
            d->type = "u_long";
        else if (accept(p, "short"))
            d->type = "u_short";
        else if (accept(p, "char"))
            d->type = "u_char";
        else
            d->type = "u_int";
    } else if (strcmp(s, "int") == 0 || strcmp(s, "float") == 0 || strcmp(s, "double") == 0 ||
               strcmp(s, "char") == 0 || strcmp(s, "short") == 0 || strcmp(s, "long") == 0) {
        d->type = xstrdup(s);
    } else if (strcmp(s, "hyper") == 0) {
        d->type = "quad_t";
    } else if (strcmp(s, "bool") == 0) {
        d->type = "bool";
    } else if (strcmp(s, "quadruple") == 0) {
        fatal_at(t.at, "quadruple is not supported (libtirpc has no xdr_quadruple)");
    } else if (strcmp(s, "void") == 0) {
        if (!void_ok)
            fatal_at(t.at, "void is not allowed here");
        d->type = "void";
    } else if (strcmp(s, "string") == 0 || strcmp(s, "opaque") == 0) {
        d->type = xstrdup(s);
    } else if (strcmp(s, "struct") == 0 || strcmp(s, "union") == 0 || strcmp(s, "enum") == 0) {
        if (is(p, "{") || (s[0] == 'u' && is(p, "switch")))
            fatal_at(peek(p)->at,
                     "an inline %s definition is not supported: define it with a name first", s);
        d->prefix = xstrdup(s);
        d->type = ident(p, "a type name");
    } else if (is_reserved(s)) {
        fatal_at(t.at, "expected a type, found the keyword \"%s\"", s);
    } else {
        int k = name_kind(p, s);
        if (k == K_CONST || k == K_PROC)
            fatal_at(t.at, "\"%s\" is a constant, not a type", s);
        d->type = xstrdup(s);
    }
}

/* declaration; allow_void: a bare "void" is a declaration (union arms). */
static void declaration(struct parser *p, struct decl *d, int allow_void)
{
    memset(d, 0, sizeof *d);
    type_spec(p, d, allow_void);
    if (strcmp(d->type, "void") == 0) {
        d->name = NULL;
        return;
    }
    d->rel = REL_ALIAS;
    if (accept(p, "*")) {
        if (!strcmp(d->type, "string") || !strcmp(d->type, "opaque"))
            fatal_at(d->at, "%s cannot be optional data ('*')", d->type);
        d->rel = REL_POINTER;
    }
    struct loc nat = peek(p)->at;
    d->name = ident(p, "a name for this declaration");
    if (d->rel == REL_POINTER)
        goto check;
    if (accept(p, "[")) {
        d->rel = REL_VECTOR;
        d->size = value(p, "the array's size");
        expect(p, "]", "after the array's size");
        if (!strcmp(d->type, "string"))
            fatal_at(nat, "a string takes <max>, not [size]");
    } else if (accept(p, "<")) {
        d->rel = REL_ARRAY;
        if (!is(p, ">"))
            d->size = value(p, "the maximum length");
        expect(p, ">", "after the maximum length");
    } else if (!strcmp(d->type, "string") || !strcmp(d->type, "opaque")) {
        fatal_at(nat, "%s \"%s\" needs a length: %s%s", d->type, d->name,
                 d->type[0] == 's' ? "<max> or <>" : "[size], <max> or <>", "");
    }
check:
    if (!strcmp(d->type, "string"))
        d->rel = REL_ALIAS; /* a string is always char *, its bound in size */
}

static void add_def(struct parser *p, struct def *d)
{
    *p->tail = d;
    p->tail = &d->next;
}

static void def_enum(struct parser *p, struct def *d)
{
    d->name = ident(p, "the enum's name");
    name_add(p, d->name, K_ENUM, d->at);
    expect(p, "{", "to open the enum's body");
    const char *prev = NULL;
    for (;;) {
        struct loc at = peek(p)->at;
        GROW(d->vals, d->nvals);
        struct enumval *v = &d->vals[d->nvals++];
        v->name = ident(p, "an enum value's name");
        name_add(p, v->name, K_CONST, at);
        if (accept(p, "="))
            v->value = value(p, "the value");
        else
            v->value = prev ? xprintf("%s + 1", prev) : xstrdup("0");
        prev = v->value;
        if (accept(p, ","))
            continue;
        expect(p, "}", "or ',' after the enum value");
        break;
    }
}

static void def_struct(struct parser *p, struct def *d)
{
    d->name = ident(p, "the struct's name");
    name_add(p, d->name, K_STRUCT, d->at);
    expect(p, "{", "to open the struct's body");
    do {
        GROW(d->decls, d->ndecls);
        declaration(p, &d->decls[d->ndecls], 0);
        for (int i = 0; i < d->ndecls; i++)
            if (!strcmp(d->decls[i].name, d->decls[d->ndecls].name))
                fatal_at(d->decls[d->ndecls].at, "member \"%s\" declared twice", d->decls[i].name);
        d->ndecls++;
        expect(p, ";", "after the member");
    } while (!accept(p, "}"));
}

static void def_union(struct parser *p, struct def *d)
{
    d->name = ident(p, "the union's name");
    name_add(p, d->name, K_UNION, d->at);
    expect(p, "switch", "after the union's name");
    expect(p, "(", "after switch");
    declaration(p, &d->disc, 0);
    if (d->disc.rel != REL_ALIAS)
        fatal_at(d->disc.at, "the discriminant must be a plain int, unsigned, enum or bool");
    expect(p, ")", "after the discriminant");
    expect(p, "{", "to open the union's body");
    while (is(p, "case")) {
        GROW(d->cases, d->ncases);
        struct ucase *c = &d->cases[d->ncases++];
        memset(c, 0, sizeof *c);
        while (accept(p, "case")) {
            GROW(c->values, c->nvalues);
            c->values[c->nvalues++] = value(p, "the case's value");
            expect(p, ":", "after the case's value");
        }
        declaration(p, &c->arm, 1);
        expect(p, ";", "after the arm");
    }
    if (accept(p, "default")) {
        expect(p, ":", "after default");
        d->deflt = xmalloc(sizeof *d->deflt);
        declaration(p, d->deflt, 1);
        expect(p, ";", "after the default arm");
    }
    if (!d->ncases)
        fatal_at(peek(p)->at, "a union needs at least one case");
    expect(p, "}", "to close the union (or another case)");
}

static void def_program(struct parser *p, struct def *d)
{
    d->name = ident(p, "the program's name");
    name_add(p, d->name, K_CONST, d->at);
    expect(p, "{", "to open the program");
    do {
        expect(p, "version", "(a program holds versions)");
        GROW(d->vers, d->nvers);
        struct version *v = &d->vers[d->nvers++];
        memset(v, 0, sizeof *v);
        struct loc vat = peek(p)->at;
        v->name = ident(p, "the version's name");
        name_add(p, v->name, K_CONST, vat);
        expect(p, "{", "to open the version");
        do {
            GROW(v->procs, v->nprocs);
            struct proc *pr = &v->procs[v->nprocs++];
            memset(pr, 0, sizeof *pr);
            type_spec(p, &pr->res, 1);
            if (!strcmp(pr->res.type, "opaque"))
                fatal_at(pr->res.at, "opaque is not a result type: typedef it first");
            pr->at = peek(p)->at;
            pr->name = ident(p, "the procedure's name");
            for (int i = 0; i + 1 < v->nprocs; i++)
                if (!strcmp(v->procs[i].name, pr->name))
                    fatal_at(pr->at, "procedure %s is defined twice in version %s", pr->name,
                             v->name);
            if (name_kind(p, pr->name) && name_kind(p, pr->name) != K_PROC)
                fatal_at(pr->at, "\"%s\" is already defined", pr->name);
            if (!name_kind(p, pr->name))
                name_add(p, pr->name, K_PROC, pr->at);
            expect(p, "(", "after the procedure's name");
            do {
                GROW(pr->args, pr->nargs);
                struct decl *a = &pr->args[pr->nargs++];
                memset(a, 0, sizeof *a);
                type_spec(p, a, pr->nargs == 1);
                if (!strcmp(a->type, "opaque"))
                    fatal_at(a->at, "opaque is not an argument type: typedef it first");
                if (!strcmp(a->type, "void") && pr->nargs > 1)
                    fatal_at(a->at, "void must be the only argument");
            } while (accept(p, ","));
            expect(p, ")", "after the arguments");
            expect(p, "=", "before the procedure's number");
            pr->number = value(p, "the procedure's number");
            expect(p, ";", "after the procedure");
            for (int i = 0; i + 1 < v->nprocs; i++)
                if (!strcmp(v->procs[i].number, pr->number))
                    fatal_at(pr->at, "procedure number %s is used twice in version %s", pr->number,
                             v->name);
        } while (!accept(p, "}"));
        expect(p, "=", "before the version's number");
        v->number = value(p, "the version's number");
        expect(p, ";", "after the version");
    } while (!accept(p, "}"));
    expect(p, "=", "before the program's number");
    d->value = value(p, "the program's number");
}

struct def *rpcgen_parse(const char *path, struct defines *defs)
{
    struct parser P = {0}, *p = &P;
    p->defs = defs;
    p->tail = &p->head;
    push_src(p, path, (struct loc){0});
    for (;;) {
        struct tok t = next(p);
        if (t.kind == TK_EOF)
            break;
        struct def *d = xmalloc(sizeof *d);
        d->at = t.at;
        if (t.kind == TK_PASS) {
            d->kind = DEF_PASS;
            d->value = t.text;
            add_def(p, d);
            continue;
        }
        if (t.kind != TK_ID)
            fatal_at(t.at, "expected a definition (const, enum, struct, union, typedef or "
                           "program), found %s", describe(&t));
        if (!strcmp(t.text, "const")) {
            d->kind = DEF_CONST;
            struct loc at = peek(p)->at;
            d->name = ident(p, "the constant's name");
            name_add(p, d->name, K_CONST, at);
            expect(p, "=", "after the constant's name");
            if (peek(p)->kind == TK_STR)
                d->value = next(p).text;
            else
                d->value = value(p, "the constant's value");
        } else if (!strcmp(t.text, "enum")) {
            d->kind = DEF_ENUM;
            d->at = peek(p)->at;
            def_enum(p, d);
        } else if (!strcmp(t.text, "struct")) {
            d->kind = DEF_STRUCT;
            d->at = peek(p)->at;
            def_struct(p, d);
        } else if (!strcmp(t.text, "union")) {
            d->kind = DEF_UNION;
            d->at = peek(p)->at;
            def_union(p, d);
        } else if (!strcmp(t.text, "typedef")) {
            d->kind = DEF_TYPEDEF;
            d->decls = xmalloc(sizeof *d->decls);
            d->ndecls = 1;
            declaration(p, d->decls, 0);
            d->name = d->decls->name;
            struct decl *td = d->decls;
            if (td->prefix && !strcmp(td->prefix, "struct") && !strcmp(td->type, td->name) &&
                td->rel == REL_ALIAS && name_kind(p, td->name) == K_STRUCT) {
                /* "typedef struct x x;" after "struct x": already so in C; nothing to add */
                expect(p, ";", "after the definition");
                continue;
            }
            name_add(p, d->name, K_TYPEDEF, d->decls->at);
        } else if (!strcmp(t.text, "program")) {
            d->kind = DEF_PROGRAM;
            d->at = peek(p)->at;
            def_program(p, d);
        } else {
            fatal_at(t.at, "expected a definition (const, enum, struct, union, typedef or "
                           "program), found %s", describe(&t));
        }
        expect(p, ";", "after the definition");
        add_def(p, d);
    }
    return p->head;
}
