/* The system calls an R template needs that R has no function for:
 * descriptors passed with SCM_RIGHTS, fork, the kernel init's process
 * tree (see cellhost_sandbox::forkplan and the Python template), dup2 and
 * a session temporary directory of the forked kernel's own.
 *
 * Built by the template with `R CMD SHLIB` into the worker's cache
 * directory; called through .C (every argument a pointer, no R headers
 * but R_TempDir). Errors come back as a negative errno in *rc. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char *R_TempDir;
extern char **environ;

#define MAX_FDS 4

static void reap(void) {
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

/* Moves the control socket from fd 0 to a high close-on-exec descriptor
 * and puts /dev/null on fd 0. */
void ch_take_socket(int *fd, int *rc) {
  int s = fcntl(0, F_DUPFD_CLOEXEC, 1000);
  if (s < 0) { *rc = -errno; return; }
  int null = open("/dev/null", O_RDWR);
  if (null >= 0 && null != 0) { dup2(null, 0); close(null); }
  *fd = s;
  *rc = 0;
}

/* One recvmsg of at most *cap bytes into buf, with up to 4 descriptors
 * into fds (*nfds of them); waits, reaping exited children every second.
 * *len is 0 at EOF. */
void ch_recv(int *sock, unsigned char *buf, int *cap, int *len, int *fds, int *nfds, int *rc) {
  *len = 0; *nfds = 0; *rc = 0;
  for (;;) {
    struct pollfd p = { .fd = *sock, .events = POLLIN };
    int n = poll(&p, 1, 1000);
    reap();
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) { *rc = -errno; return; }
    if (n == 0) continue;
    break;
  }
  char space[CMSG_SPACE(sizeof(int) * MAX_FDS)];
  struct iovec iov = { .iov_base = buf, .iov_len = (size_t)*cap };
  struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = space,
                      .msg_controllen = sizeof space };
  ssize_t got;
  do { got = recvmsg(*sock, &m, MSG_CMSG_CLOEXEC); } while (got < 0 && errno == EINTR);
  if (got < 0) { *rc = -errno; return; }
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      int *p = (int *)CMSG_DATA(c);
      for (int i = 0; i < k; i++) {
        if (*nfds < MAX_FDS) fds[(*nfds)++] = p[i]; else close(p[i]);
      }
    }
  }
  *len = (int)got;
}

void ch_send(int *sock, unsigned char *buf, int *len, int *rc) {
  int off = 0;
  *rc = 0;
  while (off < *len) {
    ssize_t w = write(*sock, buf + off, (size_t)(*len - off));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) { *rc = -errno; return; }
    off += (int)w;
  }
}

void ch_close(int *fds, int *n) {
  for (int i = 0; i < *n; i++) close(fds[i]);
}

static void die(int err_fd, const char *what) {
  char msg[512];
  int n = snprintf(msg, sizeof msg, "cellhost template: kernel init: %s: %s\n", what, strerror(errno));
  if (n > 0) { ssize_t ignored = write(err_fd, msg, (size_t)n); (void)ignored; }
  _exit(72);
}

/* Forks the kernel init A (the fork's parent gets its pid in *pid). A
 * starts the ns-init B with posix_spawn, forks the worker C and execs the
 * kernel init in adopt mode; only C returns, with *pid 0 and in out[]:
 * the control socket, stdout, stderr, the go pipe and then one open
 * cgroup.procs descriptor per path. fds[] are ctl, out, err, report. */
void ch_fork_kernel(int *fds, char **launcher, char **spec, char **cg_paths, int *n_cg,
                    int *out, int *pid, int *rc) {
  int ctl = fds[0], o = fds[1], e = fds[2], report = fds[3];
  *rc = 0;
  fflush(NULL);
  pid_t a = fork();
  if (a < 0) { *rc = -errno; return; }
  if (a > 0) { *pid = (int)a; return; }
  /* A */
  dup2(e, 2);
  setsid();
  sigset_t block, old;
  sigemptyset(&block);
  int sigs[] = { SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT };
  for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaddset(&block, sigs[i]);
  sigprocmask(SIG_BLOCK, &block, &old);
  int go[2], barrier[2];
  if (pipe2(go, O_CLOEXEC) < 0 || pipe2(barrier, O_CLOEXEC) < 0) die(e, "pipe");
  int cg[64];
  int ncg = *n_cg > 64 ? 64 : *n_cg;
  for (int i = 0; i < ncg; i++) {
    cg[i] = open(cg_paths[i], O_WRONLY | O_CLOEXEC);
    if (cg[i] < 0) die(e, cg_paths[i]);
  }
  int spec_fd = memfd_create("cellhost-ns-spec", 0);
  if (spec_fd < 0) die(e, "memfd_create");
  size_t sl = strlen(*spec);
  if (write(spec_fd, *spec, sl) != (ssize_t)sl) die(e, "spec");
  lseek(spec_fd, 0, SEEK_SET);
  char go_s[16], bar_s[16], spec_s[16];
  snprintf(go_s, sizeof go_s, "%d", go[1]);
  snprintf(bar_s, sizeof bar_s, "%d", barrier[0]);
  snprintf(spec_s, sizeof spec_s, "%d", spec_fd);
  fcntl(go[1], F_SETFD, 0);
  fcntl(barrier[0], F_SETFD, 0);
  char *bargv[] = { "cellhost", "__cellhost-ns-init", "--go-fd", go_s, "--barrier-fd", bar_s,
                    "--unshared", "0", "--spec-fd", spec_s, NULL };
  char *noenv[] = { NULL };
  pid_t b;
  int se = posix_spawn(&b, *launcher, NULL, NULL, bargv, noenv);
  if (se != 0) { errno = se; die(e, "posix_spawn of the ns-init"); }
  close(go[1]);
  close(barrier[0]);
  close(spec_fd);
  pid_t c = fork();
  if (c < 0) die(e, "fork of the worker");
  if (c == 0) {
    close(barrier[1]);
    close(report);
    sigprocmask(SIG_SETMASK, &old, NULL);
    out[0] = ctl; out[1] = o; out[2] = e; out[3] = go[0];
    for (int i = 0; i < ncg; i++) out[4 + i] = cg[i];
    *pid = 0;
    return;
  }
  for (int i = 0; i < ncg; i++) close(cg[i]);
  close(go[0]);
  close(ctl); close(o);
  fcntl(report, F_SETFD, 0);
  fcntl(barrier[1], F_SETFD, 0);
  char host_s[16], c_s[16], b_s[16], rep_s[16], rel_s[16];
  snprintf(host_s, sizeof host_s, "%d", (int)getppid());
  snprintf(c_s, sizeof c_s, "%d", (int)c);
  snprintf(b_s, sizeof b_s, "%d", (int)b);
  snprintf(rep_s, sizeof rep_s, "%d", report);
  snprintf(rel_s, sizeof rel_s, "%d", barrier[1]);
  char *aargv[] = { "cellhost", "__cellhost-kernel-init", "--host-pid", host_s, "--adopt", c_s,
                    "--adopt-ns-init", b_s, "--report-status", rep_s, "--release-fd", rel_s, NULL };
  execve(*launcher, aargv, environ);
  die(e, "exec of the kernel init");
}

/* Process C: joins its cgroups, waits for the ns-init's go, puts stdout,
 * stderr and the control socket on fds 1, 2 and 0 and closes every other
 * descriptor. *rc: 0, or -1 when the ns-init ended without a go. */
void ch_worker_setup(int *fds, int *n_cg, int *rc) {
  int ctl = fds[0], o = fds[1], e = fds[2], go = fds[3];
  *rc = 0;
  for (int i = 0; i < *n_cg; i++) {
    ssize_t ignored = write(fds[4 + i], "0", 1);
    (void)ignored;
    close(fds[4 + i]);
  }
  char buf[4096];
  size_t total = 0;
  int nonblank = 0;
  for (;;) {
    ssize_t r = read(go, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    for (ssize_t i = 0; i < r; i++)
      if (buf[i] != ' ' && buf[i] != '\n') nonblank = 1;
    total += (size_t)r;
  }
  close(go);
  if (!nonblank) { *rc = -1; return; }
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  int c2 = fcntl(ctl, F_DUPFD, 1000);
  int o2 = fcntl(o, F_DUPFD, 1000);
  int e2 = fcntl(e, F_DUPFD, 1000);
  dup2(c2, 0);
  dup2(o2, 1);
  dup2(e2, 2);
  close_range(3, ~0U, 0);
  signal(SIGTERM, SIG_DFL);
  (void)total;
}

/* A session temporary directory of this process's own under *parent
 * (R's tempdir(): the template's would be shared and removed by the first
 * kernel to quit). */
void ch_new_tempdir(char **parent, char **path, int *rc) {
  char tmpl[4096];
  snprintf(tmpl, sizeof tmpl, "%s/RtmpXXXXXX", *parent);
  if (!mkdtemp(tmpl)) { *rc = -errno; return; }
  R_TempDir = strdup(tmpl);
  *path = R_TempDir;
  *rc = 0;
}
