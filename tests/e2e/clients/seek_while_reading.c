/* For each file ROOT/fNNNN.bin (N files, each under the whole-fetch size): the file is opened
 * (fd X, close-on-exec, so nobody else shares it), another fd of it is read whole and closed so
 * the agent copies it, and once its copy is complete in TIER (or at once with TIER "-") one
 * thread reads X in small pieces to its end while another calls lseek(X, 0, SEEK_CUR) — where
 * granary may move X to the copy. Every byte the reader got must be the file's, once each.
 * Prints {"files": N, "wrong": files read wrong, "copied while open": files whose copy was
 * complete before the reads}. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fd;
static atomic_int done;
static char *got;
static size_t got_n, size;

static void *reader(void *arg) {
    (void)arg;
    char b[64];
    for (;;) {
        ssize_t n = read(fd, b, 61);
        if (n <= 0 || got_n + (size_t)n > size + 4096)
            break;
        memcpy(got + got_n, b, (size_t)n);
        got_n += (size_t)n;
    }
    atomic_store(&done, 1);
    return NULL;
}

static void *seeker(void *arg) {
    (void)arg;
    while (!atomic_load(&done))
        lseek(fd, 0, SEEK_CUR);
    return NULL;
}

/* Complete copies in TIER: TIER/<dir>/objects/<16 hex digits>. */
static int copies(const char *tier) {
    int n = 0;
    DIR *t = opendir(tier);
    struct dirent *e;
    if (!t)
        return 0;
    while ((e = readdir(t))) {
        if (e->d_name[0] == '.')
            continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s/objects", tier, e->d_name);
        DIR *o = opendir(p);
        struct dirent *f;
        if (!o)
            continue;
        while ((f = readdir(o)))
            if (strlen(f->d_name) == 16)
                n++;
        closedir(o);
    }
    closedir(t);
    return n;
}

int main(int argc, char **argv) {
    if (argc != 4)
        return 2;
    const char *root = argv[1], *tier = argv[2];
    int files = atoi(argv[3]), wrong = 0, copied = 0;
    for (int i = 0; i < files; i++) {
        char p[4096];
        struct stat st;
        snprintf(p, sizeof p, "%s/f%04d.bin", root, i);
        if (stat(p, &st) != 0)
            return 1;
        size = (size_t)st.st_size;
        char *want = malloc(size);
        got = malloc(size + 4096);
        got_n = 0;
        fd = open(p, O_RDONLY | O_CLOEXEC);
        int other = open(p, O_RDONLY | O_CLOEXEC);
        size_t k = 0;
        ssize_t n;
        while (k < size && (n = read(other, want + k, size - k)) > 0)
            k += (size_t)n;
        close(other);
        if (strcmp(tier, "-") != 0) {
            for (int w = 0; w < 1000 && copies(tier) < i + 1; w++)
                usleep(10000);
            copied += copies(tier) >= i + 1;
        }
        atomic_store(&done, 0);
        pthread_t r, s;
        pthread_create(&s, NULL, seeker, NULL);
        pthread_create(&r, NULL, reader, NULL);
        pthread_join(r, NULL);
        pthread_join(s, NULL);
        wrong += got_n != size || memcmp(got, want, size) != 0;
        close(fd);
        free(want);
        free(got);
    }
    printf("{\"files\": %d, \"wrong\": %d, \"copied while open\": %d}\n", files, wrong, copied);
    return 0;
}
