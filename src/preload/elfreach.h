/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * elfreach.h - whether LD_PRELOAD reaches a program file's connections: a statically linked
 * executable never runs the dynamic loader, and a Go program makes its socket system calls
 * itself.  Shared by the CLI (`memlan run`'s warning about the program it starts) and the
 * preload (an exec's note, exec.c: a Go server started by a shell script under memlan run was
 * said nowhere).  Its system calls go through src/sys, never through an interposer of ours.
 */
#ifndef MEMLAN_PRELOAD_ELFREACH_H
#define MEMLAN_PRELOAD_ELFREACH_H

#include "sys/sys.h"

#include <elf.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

/* A note segment (PT_NOTE) at off, size bytes, holds Go's build id (owner "Go\0\0", type 4): the
 * program is Go's, whose runtime makes its socket system calls itself, never through libc, even
 * when it is dynamically linked (cgo), so LD_PRELOAD reaches none of its connections. */
static inline bool mlp_elf_note_is_go(int fd, uint64_t off, uint64_t size)
{
    unsigned char buf[4096];
    if (size > sizeof buf)
        size = sizeof buf;
    ssize_t n = __ml_sys_pread(fd, buf, (size_t)size, (off_t)off);
    for (size_t at = 0; n > 0 && at + 12 <= (size_t)n;) {
        uint32_t namesz, descsz, type;
        memcpy(&namesz, buf + at, 4), memcpy(&descsz, buf + at + 4, 4), memcpy(&type, buf + at + 8, 4);
        if (namesz > sizeof buf || descsz > sizeof buf)
            break;
        size_t name = at + 12;
        if (type == 4 && namesz == 4 && name + 4 <= (size_t)n && memcmp(buf + name, "Go\0\0", 4) == 0)
            return true;
        at = name + ((namesz + 3u) & ~3u) + ((descsz + 3u) & ~3u);
    }
    return false;
}

/* What LD_PRELOAD makes of the program at path: 1 when it is an ELF executable without an
 * interpreter (statically linked: the dynamic loader, hence LD_PRELOAD, never runs), 2 when it is
 * a Go program (see note_is_go), 3 when it is one linked with libc (cgo: the preload is loaded,
 * and its C code's connections are accelerated, not its Go code's), 0 when dynamic, else -1
 * (unreadable, not ELF).  A "#!" script is judged by its interpreter, one level deep. */
static inline int mlp_elf_reach(const char *path, int depth, char *judged, size_t jlen)
{
    snprintf(judged, jlen, "%s", path);
    int fd = (int)__ml_sys_open(AT_FDCWD, path, O_RDONLY, 0);
    if (fd < 0)
        return -1;
    unsigned char hdr[256];
    ssize_t n = __ml_sys_pread(fd, hdr, sizeof hdr - 1, 0);
    int r = -1;
    if (n >= 2 && hdr[0] == '#' && hdr[1] == '!' && depth == 0) {
        hdr[n] = 0;
        char *p = (char *)hdr + 2;
        p += strspn(p, " \t");
        p[strcspn(p, " \t\n")] = 0;
        __ml_sys_close(fd);
        return *p ? mlp_elf_reach(p, 1, judged, jlen) : -1;
    }
    uint64_t phoff = 0;
    unsigned phnum = 0, phentsize = 0;
    bool is64 = false;
    if (n >= (ssize_t)sizeof(Elf64_Ehdr) && memcmp(hdr, ELFMAG, SELFMAG) == 0 &&
        hdr[EI_CLASS] == ELFCLASS64) {
        Elf64_Ehdr eh;
        memcpy(&eh, hdr, sizeof eh);
        phoff = eh.e_phoff, phnum = eh.e_phnum, phentsize = eh.e_phentsize;
        is64 = true;
        r = 1;
    } else if (n >= (ssize_t)sizeof(Elf32_Ehdr) && memcmp(hdr, ELFMAG, SELFMAG) == 0 &&
               hdr[EI_CLASS] == ELFCLASS32) {
        Elf32_Ehdr eh;
        memcpy(&eh, hdr, sizeof eh);
        phoff = eh.e_phoff, phnum = eh.e_phnum, phentsize = eh.e_phentsize;
        r = 1;
    }
    if (r == 1 && phentsize < (is64 ? sizeof(Elf64_Phdr) : sizeof(Elf32_Phdr)))
        r = -1;
    bool go = false;
    for (unsigned i = 0; i < phnum && r >= 0; i++) {
        unsigned char ph[sizeof(Elf64_Phdr)];
        uint64_t type, off, size;
        if (__ml_sys_pread(fd, ph, is64 ? sizeof(Elf64_Phdr) : sizeof(Elf32_Phdr),
                  (off_t)(phoff + (uint64_t)i * phentsize)) !=
            (ssize_t)(is64 ? sizeof(Elf64_Phdr) : sizeof(Elf32_Phdr))) {
            r = -1;
            break;
        }
        if (is64) {
            Elf64_Phdr p;
            memcpy(&p, ph, sizeof p);
            type = p.p_type, off = p.p_offset, size = p.p_filesz;
        } else {
            Elf32_Phdr p;
            memcpy(&p, ph, sizeof p);
            type = p.p_type, off = p.p_offset, size = p.p_filesz;
        }
        if (type == PT_INTERP)
            r = 0;
        else if (type == PT_NOTE && !go)
            go = mlp_elf_note_is_go(fd, off, size);
    }
    __ml_sys_close(fd);
    return r >= 0 && go ? (r == 0 ? 3 : 2) : r;
}

/* Why a program mlp_elf_reach judged 1, 2 or 3 runs without memlan (3: its Go code), for what
 * is said of it.  (A cgo program was said to run without memlan: its C code's connections are
 * accelerated, and one of them that its Go code read split the stream, an explorer.) */
static inline const char *mlp_elf_reach_why(int reach)
{
    return reach == 1 ? "statically linked: LD_PRELOAD cannot reach it"
           : reach == 3
               ? "a Go program linked with libc (cgo): its Go code makes its socket calls itself, "
                 "not through libc, where LD_PRELOAD could reach them (the connections its C "
                 "code makes are accelerated, and Go code must not read or write those: their "
                 "stream would split)"
               : "a Go program: Go makes its socket calls itself, not through libc, where "
                 "LD_PRELOAD could reach them";
}

/* What follows that reason: what runs without memlan. */
static inline const char *mlp_elf_reach_what(int reach)
{
    return reach == 3 ? "its Go code's connections" : "its connections";
}
#endif
