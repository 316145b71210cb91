/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* segment-export-import: export, import in both modes, mode enforcement, revocation, and refusal
 * of bad tokens, bad magic and unknown versions. */
#include "test.h"
#include "memlan/layout.h"

#include <fcntl.h>

static void poke_header(const char *token, size_t off, uint32_t val)
{
    char path[512];
    snprintf(path, sizeof path, "%s/seg-%s", ml_test_dir, token);
    int fd = open(path, O_RDWR);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, &val, sizeof val, (off_t)off), (ssize_t)sizeof val);
    close(fd);
}

int main(void)
{
    ml_test_watchdog(30);
    memlan_fabric_t *fab = ml_test_fabric();
    memlan_segment_t *ex, *im, *ro;

    ASSERT_OK(memlan_segment_export(fab, 10000, MEMLAN_MODE_RW, &ex));
    const char *tok = memlan_segment_token(ex);
    ASSERT_EQ(strlen(tok), MEMLAN_TOKEN_LEN);
    ASSERT_EQ(memlan_segment_size(ex), 10000);
    memset(memlan_segment_ptr(ex), 0xab, 10000);

    /* Two tokens are never the same. */
    memlan_segment_t *other;
    ASSERT_OK(memlan_segment_export(fab, 1, MEMLAN_MODE_RO, &other));
    ASSERT_NE(strcmp(tok, memlan_segment_token(other)), 0);

    ASSERT_OK(memlan_segment_import(fab, tok, MEMLAN_MODE_RW, &im));
    ASSERT_EQ(memlan_segment_size(im), 10000);
    unsigned char *p = memlan_segment_ptr(im);
    ASSERT_EQ(p[0], 0xab);
    ASSERT_EQ(p[9999], 0xab);
    p[5] = 7; /* writes of an RW importer reach the exporter */
    ASSERT_EQ(((unsigned char *)memlan_segment_ptr(ex))[5], 7);
    ASSERT_EQ(memlan_segment_check(im), 0);

    /* Read-only: an RO import of an RW export works; RW of an RO export is refused. */
    ASSERT_OK(memlan_segment_import(fab, tok, MEMLAN_MODE_RO, &ro));
    ASSERT_EQ(((unsigned char *)memlan_segment_ptr(ro))[5], 7);
    memlan_segment_t *bad = (memlan_segment_t *)1;
    ASSERT_EQ(memlan_segment_import(fab, memlan_segment_token(other), MEMLAN_MODE_RW, &bad),
              -EACCES);
    ASSERT_TRUE(bad == NULL);
    memlan_segment_t *ro2;
    ASSERT_OK(memlan_segment_import(fab, memlan_segment_token(other), MEMLAN_MODE_RO, &ro2));
    memlan_segment_close(ro2);

    /* Tokens: malformed, unknown, wrong kind. */
    ASSERT_EQ(memlan_segment_import(fab, "nope", MEMLAN_MODE_RO, &bad), -EINVAL);
    ASSERT_EQ(memlan_segment_import(fab, "../../../../etc/passwd0000000000", MEMLAN_MODE_RO, &bad),
              -EINVAL);
    ASSERT_EQ(memlan_segment_import(fab, "0123456789abcdef0123456789abcdef", MEMLAN_MODE_RO, &bad),
              -ENOENT);
    ASSERT_EQ(memlan_segment_import(fab, "0123456789ABCDEF0123456789ABCDEF", MEMLAN_MODE_RO, &bad),
              -EINVAL);
    memlan_channel_t *ch;
    ASSERT_EQ(memlan_channel_attach(fab, tok, &ch), -EPROTO); /* a raw segment is no channel */
    ASSERT_EQ(memlan_segment_revoke(im), -EPERM);             /* only the exporter revokes */

    /* Malformed header and unknown version are refused with clear errors. */
    memlan_segment_t *v;
    ASSERT_OK(memlan_segment_export(fab, 100, MEMLAN_MODE_RW, &v));
    poke_header(memlan_segment_token(v), offsetof(struct ml_seg_hdr, version), 99);
    ASSERT_EQ(memlan_segment_import(fab, memlan_segment_token(v), MEMLAN_MODE_RW, &bad),
              -EPROTONOSUPPORT);
    poke_header(memlan_segment_token(v), offsetof(struct ml_seg_hdr, version), ML_LAYOUT_VERSION);
    poke_header(memlan_segment_token(v), offsetof(struct ml_seg_hdr, body_off), 1u << 30);
    ASSERT_EQ(memlan_segment_import(fab, memlan_segment_token(v), MEMLAN_MODE_RW, &bad), -EPROTO);
    poke_header(memlan_segment_token(v), 0, 0x12345678); /* magic */
    ASSERT_EQ(memlan_segment_import(fab, memlan_segment_token(v), MEMLAN_MODE_RW, &bad), -EPROTO);
    memlan_segment_close(v);

    /* Revocation: no new imports; existing importers see it on their next check and can still
     * touch their mapping without faulting. */
    char saved[MEMLAN_TOKEN_LEN + 1];
    strcpy(saved, tok);
    ASSERT_OK(memlan_segment_revoke(ex));
    ASSERT_EQ(memlan_segment_check(im), -ECONNABORTED);
    ASSERT_EQ(memlan_segment_check(ro), -ECONNABORTED);
    ASSERT_EQ(p[0], 0xab);
    ASSERT_EQ(memlan_segment_import(fab, saved, MEMLAN_MODE_RO, &bad), -ENOENT);

    memlan_segment_close(im);
    memlan_segment_close(ro);
    memlan_segment_close(ex);
    memlan_segment_close(other);

    /* An exporter that dies: importers see -EOWNERDEAD, and the file is reclaimed. */
    int pfd[2];
    ASSERT_OK(pipe(pfd));
    pid_t pid = fork();
    if (pid == 0) {
        memlan_segment_t *s;
        if (memlan_segment_export(fab, 64, MEMLAN_MODE_RW, &s) < 0)
            _exit(1);
        (void)!write(pfd[1], memlan_segment_token(s), MEMLAN_TOKEN_LEN + 1);
        pause();
        _exit(0);
    }
    char ctok[MEMLAN_TOKEN_LEN + 1];
    ASSERT_EQ(read(pfd[0], ctok, sizeof ctok), (ssize_t)sizeof ctok);
    memlan_segment_t *cs;
    ASSERT_OK(memlan_segment_import(fab, ctok, MEMLAN_MODE_RW, &cs));
    ASSERT_EQ(memlan_segment_check(cs), 0);
    kill(pid, SIGKILL);
    ml_test_wait_child(pid);
    ASSERT_EQ(memlan_segment_check(cs), -EOWNERDEAD);
    ASSERT_EQ(memlan_fabric_clean(fab), 1);
    memlan_segment_close(cs);
    ml_test_fabric_empty(fab);
    printf("segment-export-import: ok\n");
    return 0;
}
