/*
 * test_fmt_cli.c - the qshard binary's `inspect` and `verify` on rank files and directories
 * (QSHARD names the binary; default build/qshard): exit codes (docs/DESIGN.md section 2), the
 * verify rule (2 = a file cannot be parsed, 5 = a check failed) per corrupted region, exactly one
 * error line per failure, per-file status and summary lines, directories with and without a
 * manifest, ranks of another conversion.
 *
 * Run from the repository root: ./build/test_fmt_cli. Helpers: tests/t_fmt.h.
 */
#include "t_fmt.h"

/* --- 6. the qshard binary ------------------------------------------------------------------ */

static int run_cli(const char *args, char *out, size_t out_n)
{
    const char *bin = getenv("QSHARD") ? getenv("QSHARD") : "build/qshard";
    char cmd[2048], of[600];
    path_in(of, sizeof(of), "cli.out");
    snprintf(cmd, sizeof(cmd), "%s %s >%s 2>&1", bin, args, of);
    int st = system(cmd);
    if (out) {
        size_t n = 0;
        uint8_t *b = read_file(of, &n);
        n = n < out_n - 1 ? n : out_n - 1;
        if (b)
            memcpy(out, b, n);
        out[n] = 0;
        free(b);
    }
    unlink(of);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli(void)
{
    static char out[1 << 16];
    char dir[400], args[1500], p[600];
    uint8_t id[16];
    fill_random(id, 16);
    snprintf(dir, sizeof(dir), "%s/cli", g_dir);
    make_model_dir(dir, 2, id);
    CHECK_EQ_INT(fmt_manifest_write(dir, 2), FMT_ERR_NONE);
    snprintf(p, sizeof(p), "%s/rank-0-of-2.qshard", dir);

    CHECK_EQ_INT(run_cli("inspect", NULL, 0), 1);
    CHECK_EQ_INT(run_cli("verify", NULL, 0), 1);
    CHECK_EQ_INT(run_cli("inspect --help", NULL, 0), 0);
    CHECK_EQ_INT(run_cli("verify --no-such-flag x", NULL, 0), 1);
    snprintf(args, sizeof(args), "inspect --tensors %s", p);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 0);
    CHECK(strstr(out, "c.qweight") && strstr(out, "W4_MMA_T16X64") && strstr(out, "[16, 64]"));
    snprintf(args, sizeof(args), "inspect --json %s", p);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 0);
    cJSON *j = cJSON_Parse(out);
    CHECK_MSG(j != NULL, "inspect --json output is not JSON: %.200s", out);
    if (j) {
        const cJSON *files = cJSON_GetObjectItem(j, "files");
        const cJSON *f0 = cJSON_GetArrayItem(files, 0);
        const cJSON *tens = cJSON_GetObjectItem(f0, "tensors");
        CHECK_EQ_INT(cJSON_GetArraySize(tens), 3);
        const cJSON *t2 = cJSON_GetArrayItem(tens, 2);
        CHECK_EQ_STR(cJSON_GetStringValue(cJSON_GetObjectItem(t2, "name")), "c.qweight");
        CHECK_EQ_STR(cJSON_GetStringValue(cJSON_GetObjectItem(t2, "dtype")), "Q4");
        cJSON_Delete(j);
    }
    snprintf(args, sizeof(args), "inspect %s", dir);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 0);
    CHECK(strstr(out, "rank-1-of-2.qshard") != NULL);
    snprintf(args, sizeof(args), "verify %s", p);
    CHECK_EQ_INT(run_cli(args, NULL, 0), 0);
    snprintf(args, sizeof(args), "verify %s", dir);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 0);
    snprintf(args, sizeof(args), "verify %s/does-not-exist.qshard", dir);
    CHECK_EQ_INT(run_cli(args, NULL, 0), 4);

    /* a flipped tensor byte: inspect is fine (open does not read data), verify fails with 5 */
    size_t n;
    uint8_t *b = read_file(p, &n);
    b[3 * 4096 + 7] ^= 0x10; /* inside c.qweight, the third tensor */
    char bad[600];
    snprintf(bad, sizeof(bad), "%s/bad.qshard", g_dir);
    write_file(bad, b, n);
    snprintf(args, sizeof(args), "inspect %s", bad);
    CHECK_EQ_INT(run_cli(args, NULL, 0), 0);
    snprintf(args, sizeof(args), "verify %s", bad);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 5);
    CHECK_MSG(strstr(out, "c.qweight") && strstr(out, "bad.qshard"), "verify output: %s", out);
    snprintf(args, sizeof(args), "verify --tensor b.weight %s", bad); /* lazily: one tensor */
    CHECK_EQ_INT(run_cli(args, NULL, 0), 0);
    snprintf(args, sizeof(args), "verify -t c.qweight %s", bad);
    CHECK_EQ_INT(run_cli(args, NULL, 0), 5);
    snprintf(args, sizeof(args), "verify -t no.such.tensor %s", bad);
    CHECK_EQ_INT(run_cli(args, NULL, 0), 2);
    /* same corruption inside the model directory */
    write_file(p, b, n);
    snprintf(args, sizeof(args), "verify %s", dir);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 5);
    CHECK(strstr(out, "c.qweight") && strstr(out, "rank-0-of-2.qshard"));
    /* a structural corruption: bad magic -> 2 for both */
    b[0] = 'X';
    write_file(bad, b, n);
    snprintf(args, sizeof(args), "inspect %s", bad);
    CHECK_EQ_INT(run_cli(args, NULL, 0), 2);
    snprintf(args, sizeof(args), "verify %s", bad);
    CHECK_EQ_INT(run_cli(args, NULL, 0), 2);
    free(b);
    /* missing rank in a directory -> 5 */
    unlink(p);
    snprintf(args, sizeof(args), "verify %s", dir);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 5);
    CHECK(strstr(out, "rank-0-of-2.qshard") != NULL);
    unlink(bad);
}

/* Occurrences of `needle` in `hay`. */
static int count_str(const char *hay, const char *needle)
{
    int c = 0;
    for (const char *q = hay; (q = strstr(q, needle)); q += strlen(needle))
        c++;
    return c;
}

/* The last non-empty line of `s`, copied into buf. */
static const char *last_line(const char *s, char *buf, size_t n)
{
    size_t e = strlen(s);
    while (e > 0 && s[e - 1] == '\n')
        e--;
    size_t b = e;
    while (b > 0 && s[b - 1] != '\n')
        b--;
    size_t l = e - b < n - 1 ? e - b : n - 1;
    memcpy(buf, s + b, l);
    buf[l] = 0;
    return buf;
}

/* One corruption of a single rank file and the exit codes it must give. */
struct vcase {
    const char *what;
    int verify_rc, inspect_rc;
    const char *msg; /* in the one error line */
};

/* Apply case c to a copy of a good rank file (b, *n); returns the case. */
static struct vcase vmutate(int c, uint8_t *b, size_t *n)
{
    uint64_t meta = ld64(b + 72);
    switch (c) {
    case 0:
        b[20] ^= 0x01;
        return (struct vcase){"header flags byte (offset 20)", 5, 2, "header checksum"};
    case 1:
        b[sec_off(b, 1, NULL) + 3] ^= 0x01;
        return (struct vcase){"CONFIG section byte", 5, 2, "section CONFIG checksum"};
    case 2:
        tentry(b, 0)[80] ^= 0x01;
        return (struct vcase){"tensor hash in the tensor table", 5, 2,
                              "section TENSOR_TABLE checksum"};
    case 3:
        b[3 * 4096 + 7] ^= 0x10;
        return (struct vcase){"tensor data byte", 5, 0, "c.qweight"};
    case 4:
        b[meta] = 0x5a;
        return (struct vcase){"padding after the metadata", 5, 0, "padding"};
    case 5:
        *n -= 1;
        return (struct vcase){"truncated by one byte", 2, 2, "truncated"};
    case 6:
        b[0] = 'X';
        return (struct vcase){"bad magic", 2, 2, "magic"};
    case 7:
        st64(tentry(b, 2) + 64, 1ull << 40);
        rehash(b, *n);
        return (struct vcase){"tensor offset past the end", 2, 2, "c.qweight"};
    default:
        return (struct vcase){NULL, 0, 0, NULL};
    }
}

/*
 * `verify`'s exit rule (2 = cannot be parsed, 5 = a check failed on a parsed file, whatever
 * part of the file the byte is in), one error line per failure (no second "FAILED: ... FMT_ERR_"
 * line), per-file status lines and an unambiguous summary, directories with and without
 * manifest.
 */
/* `verify` and `inspect` of single files: good0 [n0] mutated by each vmutate case into f. */
static void verify_single_cases(const uint8_t *good0, size_t n0, const char *f)
{
    static char out[1 << 16];
    char args[1500], line[512], want[700];
    for (int c = 0;; c++) {
        size_t n = n0;
        uint8_t *b = malloc(n0);
        memcpy(b, good0, n0);
        struct vcase vc = vmutate(c, b, &n);
        if (!vc.what) {
            free(b);
            break;
        }
        write_file(f, b, n);
        free(b);
        snprintf(args, sizeof(args), "verify %s", f);
        int rc = run_cli(args, out, sizeof(out));
        CHECK_MSG(rc == vc.verify_rc, "verify, %s: exit %d, expected %d", vc.what, rc,
                  vc.verify_rc);
        CHECK_MSG(count_str(out, ": error:") == 1 && !strstr(out, "FMT_ERR_"),
                  "verify, %s: expected one error line: %s", vc.what, out);
        CHECK_MSG(strstr(out, vc.msg) != NULL, "verify, %s: no \"%s\" in %s", vc.what, vc.msg, out);
        snprintf(want, sizeof(want), "FAILED: %s\n", f);
        CHECK_MSG(strstr(out, want) != NULL, "verify, %s: no status line: %s", vc.what, out);
        CHECK_MSG(!strcmp(last_line(out, line, sizeof(line)), "FAILED: 1 of 1 file"),
                  "verify, %s: summary: %s", vc.what, line);
        snprintf(args, sizeof(args), "inspect %s", f);
        rc = run_cli(args, out, sizeof(out));
        CHECK_MSG(rc == vc.inspect_rc, "inspect, %s: exit %d, expected %d", vc.what, rc,
                  vc.inspect_rc);
        if (vc.inspect_rc)
            CHECK_MSG(count_str(out, ": error:") == 1 && !strstr(out, "FMT_ERR_"),
                      "inspect, %s: expected one error line: %s", vc.what, out);
    }
}

static void test_cli_verify(void)
{
    static char out[1 << 16];
    char dir[400], args[1500], p0[600], p1[600], f[600], man[600], line[512], want[700];
    uint8_t id[16], id2[16];
    fill_random(id, 16);
    fill_random(id2, 16);
    snprintf(dir, sizeof(dir), "%s/vfy", g_dir);
    make_model_dir(dir, 2, id);
    CHECK_EQ_INT(fmt_manifest_write(dir, 2), FMT_ERR_NONE);
    snprintf(p0, sizeof(p0), "%s/rank-0-of-2.qshard", dir);
    snprintf(p1, sizeof(p1), "%s/rank-1-of-2.qshard", dir);
    snprintf(man, sizeof(man), "%s/%s", dir, FMT_MANIFEST_NAME);
    snprintf(f, sizeof(f), "%s/one.qshard", g_dir);
    size_t n0, n1;
    uint8_t *good0 = read_file(p0, &n0), *good1 = read_file(p1, &n1);
    if (!good0 || !good1) {
        CHECK_MSG(0, "cannot read the model written to %s", dir);
        goto out;
    }
    CHECK_MSG(ld64(good0 + 72) % 4096 != 0, "the padding case needs meta_size %% 4096 != 0");

    /* a good directory: per-file lines in MiB/s, the manifest line says what it checked */
    snprintf(args, sizeof(args), "verify %s", dir);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 0);
    CHECK_MSG(strstr(out, "2 ranks present") && strstr(out, "metadata digests match"), "%s", out);
    CHECK_MSG(strstr(out, "MiB/s") && !strstr(out, "GB/s"), "%s", out);
    CHECK_EQ_INT(count_str(out, ": error:"), 0);
    CHECK_MSG(strncmp(last_line(out, line, sizeof(line)), "ok: all 2 files verified", 24) == 0,
              "summary: %s", line);
    snprintf(args, sizeof(args), "verify --help");
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 0);
    CHECK_MSG(strstr(out, "2 a file cannot be parsed") && strstr(out, "5 verification failed"),
              "verify --help does not state the exit rule: %s", out);

    /* 1 + 3: single files, one case per check; exactly one error line, no FMT_ERR_ echo */
    verify_single_cases(good0, n0, f);

    /* 2: flipped tensor data in rank 0 of a directory: the manifest line does not vouch for the
     * data, rank 1 is still verified, the summary counts files */
    uint8_t *b = malloc(n0);
    memcpy(b, good0, n0);
    b[3 * 4096 + 7] ^= 0x10;
    write_file(p0, b, n0);
    snprintf(args, sizeof(args), "verify %s", dir);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 5);
    CHECK_MSG(strstr(out, "metadata digests match") && !strstr(out, "sizes and digests match"),
              "%s", out);
    snprintf(want, sizeof(want), "FAILED: %s\n", p0);
    CHECK_MSG(strstr(out, want) != NULL, "%s", out);
    snprintf(want, sizeof(want), "ok: %s: 3 tensors", p1);
    CHECK_MSG(strstr(out, want) != NULL, "%s", out);
    CHECK_EQ_INT(count_str(out, ": error:"), 1);
    CHECK_MSG(!strcmp(last_line(out, line, sizeof(line)), "FAILED: 1 of 2 files"), "summary: %s",
              line);
    /* 1: a header byte of rank 0 in a directory: 5 as for a single file; rank 1 still checked,
     * no "ok" for the manifest */
    memcpy(b, good0, n0);
    b[20] ^= 0x01;
    write_file(p0, b, n0);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 5);
    CHECK_MSG(!strstr(out, "digests match") && strstr(out, want), "%s", out);
    CHECK_EQ_INT(count_str(out, ": error:"), 1);
    /* truncated rank 0: cannot be parsed, 2 */
    write_file(p0, good0, n0 - 4096);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 2);
    CHECK_MSG(strstr(out, want) != NULL, "%s", out);
    write_file(p0, good0, n0);
    free(b);
    /* manifest digest mismatch: rank 1 rewritten valid but different (generation config "0.7"
     * -> "0.8", hashes recomputed) */
    b = malloc(n1);
    memcpy(b, good1, n1);
    uint64_t gsz, goff = sec_off(b, 3, &gsz);
    uint8_t *seven = memchr(b + goff, '7', gsz);
    CHECK(seven != NULL);
    if (seven)
        *seven = '8';
    rehash(b, n1);
    write_file(p1, b, n1);
    free(b);
    snprintf(args, sizeof(args), "inspect %s", p1);
    CHECK_EQ_INT(run_cli(args, NULL, 0), 0); /* the file itself is fine */
    snprintf(args, sizeof(args), "verify %s", dir);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 5);
    CHECK_MSG(strstr(out, "manifest says") && count_str(out, ": error:") == 1, "%s", out);
    snprintf(args, sizeof(args), "inspect %s", dir);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 2);
    CHECK_MSG(count_str(out, ": error:") == 1 && !strstr(out, "FMT_ERR_"), "%s", out);
    /* a rank of another conversion: 5 */
    CHECK_EQ_INT(base_write(p1, 1, 2, id2), FMT_ERR_NONE);
    snprintf(args, sizeof(args), "verify %s", dir);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 5);
    write_file(p1, good1, n1);
    CHECK_EQ_INT(run_cli(args, NULL, 0), 0);
    /* a malformed manifest cannot be parsed: 2 */
    write_file(man, "{\"format\":", 10);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 2);
    CHECK_MSG(count_str(out, ": error:") == 1 && !strstr(out, "FMT_ERR_"), "%s", out);
    CHECK_MSG(strstr(last_line(out, line, sizeof(line)), "without a usable manifest.json") != NULL,
              "summary: %s", line);

    /* 4: no manifest: inspect shows the files, verify checks every file and then fails with 5 */
    unlink(man);
    snprintf(args, sizeof(args), "inspect %s", dir);
    CHECK_EQ_INT(run_cli(args, NULL, 0), 0);
    snprintf(args, sizeof(args), "verify %s", dir);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 5);
    CHECK_MSG(strstr(out, "no manifest.json: the set cannot be checked for completeness") &&
              strstr(out, want), "%s", out);
    snprintf(want, sizeof(want), "ok: %s: 3 tensors", p0);
    CHECK_MSG(strstr(out, want) != NULL, "%s", out);
    CHECK_MSG(strncmp(last_line(out, line, sizeof(line)), "FAILED: all 2 files passed", 26) == 0,
              "summary: %s", line);
    b = malloc(n0); /* ... and a corrupt file in it is still found */
    memcpy(b, good0, n0);
    b[3 * 4096 + 7] ^= 0x10;
    write_file(p0, b, n0);
    free(b);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 5);
    CHECK_MSG(strstr(out, "c.qweight") && strstr(out, "1 of 2 files failed"), "%s", out);
    unlink(p0);
    unlink(p1);
    CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 2); /* nothing to verify at all */
    CHECK_EQ_INT(count_str(out, ": error:"), 1);
out:
    unlink(f);
    free(good0);
    free(good1);
}

/* `inspect` names what a file was converted from (config "quant": source_format, layout,
 * container, symmetric, act-order), for one fixture of each source format (tests/data/models). */
static void test_cli_source(void)
{
    static char out[1 << 16];
    static const struct {
        const char *fixture, *want;
    } cases[] = {
        {"llama-gqa-gemm", "source: awq checkpoint (layout gemm, container safetensors)\n"},
        {"llama-sym-awq-gemm", "source: awq checkpoint (layout gemm, container safetensors), symmetric\n"},
        {"llama-gqa-gptq", "source: gptq checkpoint (layout gptq, container safetensors)\n"},
        {"llama-sym-ct", "source: compressed-tensors checkpoint (layout compressed-tensors, "
                         "container safetensors), symmetric\n"},
        {"llama-actorder-gptq", "source: gptq checkpoint (layout gptq, container safetensors), "
                                "act-order\n"},
        {"llama-actorder-ct", "source: compressed-tensors checkpoint (layout compressed-tensors, "
                              "container safetensors), act-order\n"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char dir[400], args[1500];
        snprintf(dir, sizeof(dir), "%s/src-%zu", g_dir, i);
        snprintf(args, sizeof(args), "convert tests/data/models/%s %s --tp 1 -q", cases[i].fixture,
                 dir);
        CHECK_MSG(run_cli(args, out, sizeof(out)) == 0, "convert %s: %s", cases[i].fixture, out);
        snprintf(args, sizeof(args), "inspect %s", dir);
        CHECK_EQ_INT(run_cli(args, out, sizeof(out)), 0);
        CHECK_MSG(strstr(out, cases[i].want) != NULL, "inspect of %s lacks '%s': %s",
                  cases[i].fixture, cases[i].want, out);
    }
}

int main(void)
{
    if (!t_fmt_init("fmt_cli", true))
        return 1;
    test_cli();
    test_cli_verify();
    test_cli_source();
    rm_rf(g_dir);
    return t_done();
}
