/* The system calls R has no function for, for the R template and worker:
 * descriptors passed with SCM_RIGHTS, fork, the kernel init's process
 * tree (see cellhost_sandbox::forkplan and the Python template), the
 * confinement steps of a forked kernel (the plan's rlimits, namespaces,
 * bounding set, uid, Landlock, capabilities and seccomp, as the Python
 * template's confine.py makes them), dup2, a session temporary directory
 * of the forked kernel's own, and R's SIGINT handler kept armed.
 *
 * Built with `R CMD SHLIB` into the worker's cache directory (see
 * cellhost_native.R); called through .C (every argument a pointer, no R
 * headers but R_TempDir). Errors come back as a negative errno in *rc. */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stdint.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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

/* Lowers each limit to its value, never above the hard limit. */
static int lower_rlimits(char **names, double *values, int n) {
  static const struct { const char *name; int res; } known[] = {
    { "core", RLIMIT_CORE }, { "nofile", RLIMIT_NOFILE }, { "fsize", RLIMIT_FSIZE }, { "as", RLIMIT_AS },
  };
  for (int i = 0; i < n; i++) {
    int res = -1;
    for (unsigned k = 0; k < sizeof known / sizeof known[0]; k++)
      if (strcmp(names[i], known[k].name) == 0) res = known[k].res;
    if (res < 0) { errno = EINVAL; return -1; }
    struct rlimit cur;
    if (getrlimit(res, &cur) != 0) return -1;
    rlim_t want = values[i] < 0 ? 0 : (rlim_t)values[i];
    if (cur.rlim_max != RLIM_INFINITY && want > cur.rlim_max) want = cur.rlim_max;
    struct rlimit next = { want, want };
    if (setrlimit(res, &next) != 0) return -1;
  }
  return 0;
}

static int write_proc_self(const char *name, const char *text) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/%s", name);
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t n = strlen(text);
  ssize_t w = write(fd, text, n);
  int saved = errno;
  close(fd);
  if (w != (ssize_t)n) { errno = w < 0 ? saved : EIO; return -1; }
  return 0;
}

/* unshare(CLONE_NEWUSER) and this process's own maps (see
 * cellhost_sandbox::forkplan::UserNsPlan). */
static void enter_user_namespace(int err_fd, int uid, int gid) {
  char map[64];
  if (unshare(CLONE_NEWUSER) != 0) die(err_fd, "user namespace: unshare(CLONE_NEWUSER)");
  if (write_proc_self("setgroups", "deny") != 0) die(err_fd, "user namespace: /proc/self/setgroups");
  snprintf(map, sizeof map, "%d %d 1", uid, uid);
  if (write_proc_self("uid_map", map) != 0) die(err_fd, "user namespace: /proc/self/uid_map");
  snprintf(map, sizeof map, "%d %d 1", gid, gid);
  if (write_proc_self("gid_map", map) != 0) die(err_fd, "user namespace: /proc/self/gid_map");
}

static int last_cap(void) {
  int cap = 0;
  while (prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0) cap++;
  return cap - 1;
}

static int capset_all(uint32_t lo, uint32_t hi, int inheritable) {
  struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
  struct __user_cap_data_struct d[2] = {
    { lo, lo, inheritable ? lo : 0 }, { hi, hi, inheritable ? hi : 0 },
  };
  return (int)syscall(SYS_capset, &h, d);
}

/* Raises every capability into the inheritable and ambient sets so that
 * the ns-init keeps them through its exec (uid not 0); undone by
 * PR_CAP_AMBIENT_CLEAR_ALL once it is started. */
static void keep_capabilities_across_exec(int err_fd) {
  int last = last_cap();
  if (last < 0) die(err_fd, "prctl(PR_CAPBSET_READ)");
  uint64_t full = last >= 63 ? ~0ULL : ((1ULL << (last + 1)) - 1);
  if (capset_all((uint32_t)full, (uint32_t)(full >> 32), 1) != 0) die(err_fd, "capset (inheritable)");
  for (int cap = 0; cap <= last; cap++)
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) != 0) die(err_fd, "prctl(PR_CAP_AMBIENT_RAISE)");
}

/* Forks the kernel init A (the fork's parent gets its pid in *pid). A
 * runs the plan's init steps (init_steps, in order: "rlimits" lowers the
 * n_rl limits rl_names/rl_values; "namespaces" enters a user namespace of
 * its own when userns[0] >= 0, then unshares `unshare_flags` but the
 * cgroup namespace), starts the ns-init B with posix_spawn, forks the
 * worker C and execs the kernel init in adopt mode; only C returns, with
 * *pid 0, *kid the kernel's uid (uid_base plus A's pid as
 * cellhost_sandbox::profile::kernel_id, or -1) and in out[]: the control
 * socket, stdout, stderr, the go pipe and then one open cgroup.procs
 * descriptor per path. fds[] are ctl, out, err, report. spec is the JSON
 * of the ns-init's spec (`null` with the sandbox off). */
void ch_fork_kernel(int *fds, char **launcher, char **spec, char **cg_paths, int *n_cg,
                    char **init_steps, int *n_steps, int *unshare_flags,
                    char **rl_names, double *rl_values, int *n_rl, int *userns,
                    double *uid_base, int *out, int *kid, int *pid, int *rc) {
  int ctl = fds[0], o = fds[1], e = fds[2], report = fds[3];
  *rc = 0;
  fflush(NULL);
  pid_t a = fork();
  if (a < 0) { *rc = -errno; return; }
  if (a > 0) { *pid = (int)a; return; }
  /* A */
  dup2(e, 2);
  setsid();
  int flags = *unshare_flags;
  int user_ns = userns[0] >= 0;
  for (int i = 0; i < *n_steps; i++) {
    if (strcmp(init_steps[i], "rlimits") == 0) {
      if (lower_rlimits(rl_names, rl_values, *n_rl) != 0) die(e, "rlimits");
    } else if (strcmp(init_steps[i], "namespaces") == 0) {
      if (user_ns) enter_user_namespace(e, userns[0], userns[1]);
      /* The cgroup namespace is the worker's, made once it has joined its
       * cgroups (its root is then the kernel's own group). */
      if ((flags & ~CLONE_NEWCGROUP) && unshare(flags & ~CLONE_NEWCGROUP) != 0) die(e, "unshare");
    } else {
      errno = EINVAL;
      die(e, init_steps[i]);
    }
  }
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
  int k = -1;
  if (*uid_base >= 0 && geteuid() == 0) k = (int)((long long)*uid_base + (getpid() & 0x3FFFFF));
  int spec_fd = memfd_create("cellhost-ns-spec", 0);
  if (spec_fd < 0) die(e, "memfd_create");
  char kid_s[16];
  if (k >= 0) snprintf(kid_s, sizeof kid_s, "%d", k); else snprintf(kid_s, sizeof kid_s, "null");
  if (dprintf(spec_fd, "{\"spec\":%s,\"kernel_id\":%s}", *spec, kid_s) < 0) die(e, "spec");
  lseek(spec_fd, 0, SEEK_SET);
  char go_s[16], bar_s[16], spec_s[16], flags_s[16];
  snprintf(go_s, sizeof go_s, "%d", go[1]);
  snprintf(bar_s, sizeof bar_s, "%d", barrier[0]);
  snprintf(spec_s, sizeof spec_s, "%d", spec_fd);
  snprintf(flags_s, sizeof flags_s, "%d", flags);
  fcntl(go[1], F_SETFD, 0);
  fcntl(barrier[0], F_SETFD, 0);
  char *bargv[] = { "cellhost", "__cellhost-ns-init", "--go-fd", go_s, "--barrier-fd", bar_s,
                    "--unshared", flags_s, "--spec-fd", spec_s, NULL };
  char *noenv[] = { NULL };
  /* Not root: B mounts the kernel's root and must keep this namespace's
   * capabilities through its exec; nothing started after it gets them. */
  if (user_ns) keep_capabilities_across_exec(e);
  pid_t b;
  int se = posix_spawn(&b, *launcher, NULL, NULL, bargv, noenv);
  if (se != 0) { errno = se; die(e, "posix_spawn of the ns-init"); }
  if (user_ns && prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0)
    die(e, "prctl(PR_CAP_AMBIENT_CLEAR_ALL)");
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
    *kid = k;
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

/* Process C: joins its cgroups, takes a cgroup namespace rooted at its
 * own group when *cgroupns, waits for the ns-init's go (its JSON into
 * go_buf, at most *go_cap bytes, *go_len of them), puts stdout, stderr
 * and the control socket on fds 1, 2 and 0 and closes every other
 * descriptor. *rc: 0; -1 when the ns-init ended without a go; another
 * negative errno when the cgroup namespace cannot be made. */
void ch_worker_setup(int *fds, int *n_cg, int *cgroupns, unsigned char *go_buf, int *go_cap,
                     int *go_len, int *rc) {
  int ctl = fds[0], o = fds[1], e = fds[2], go = fds[3];
  *rc = 0;
  *go_len = 0;
  for (int i = 0; i < *n_cg; i++) {
    ssize_t ignored = write(fds[4 + i], "0", 1);
    (void)ignored;
    close(fds[4 + i]);
  }
  if (*cgroupns && unshare(CLONE_NEWCGROUP) != 0) { *rc = -errno; close(go); return; }
  char buf[4096];
  int nonblank = 0;
  for (;;) {
    ssize_t r = read(go, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    for (ssize_t i = 0; i < r; i++) {
      if (buf[i] != ' ' && buf[i] != '\n') nonblank = 1;
      if (*go_len < *go_cap) go_buf[(*go_len)++] = (unsigned char)buf[i];
    }
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
}

/* ---- the worker's confinement steps (cellhost_sandbox::forkplan) ----
 * Each sets *rc to 0, or to a negative errno with *msg naming the call. */

static char step_msg[512];

static void step_failed(int *rc, char **msg, const char *what) {
  int err = errno;
  snprintf(step_msg, sizeof step_msg, "%s: %s", what, strerror(err));
  *rc = err ? -err : -EINVAL;
  *msg = step_msg;
}

/* Clears the capability bounding set as far as this process may. */
void ch_drop_bounding_set(int *rc) {
  for (int cap = 0; prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0; cap++)
    prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
  *rc = 0;
}

/* setgroups([]), setresgid(k), setresuid(k); stays dumpable. */
void ch_become_id(int *k, int *rc, char **msg) {
  *rc = 0;
  gid_t g = (gid_t)*k;
  uid_t u = (uid_t)*k;
  if (setgroups(0, NULL) != 0) { step_failed(rc, msg, "setgroups"); return; }
  if (setresgid(g, g, g) != 0) { step_failed(rc, msg, "setresgid"); return; }
  if (setresuid(u, u, u) != 0) { step_failed(rc, msg, "setresuid"); return; }
  if (getuid() != u || geteuid() != u || getegid() != g || getgroups(0, NULL) != 0) {
    errno = EPERM;
    step_failed(rc, msg, "setresuid: the ids did not change");
    return;
  }
  prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
}

struct ruleset_attr { uint64_t handled_access_fs, handled_access_net, scoped; };
struct path_beneath { uint64_t allowed_access; int32_t parent_fd; } __attribute__((packed));

/* Landlock's system calls have the same numbers on every architecture. */
#define CH_LANDLOCK_CREATE_RULESET 444
#define CH_LANDLOCK_ADD_RULE 445
#define CH_LANDLOCK_RESTRICT_SELF 446

/* A ruleset handling `handled` (and scoping `scoped`) with one
 * path_beneath rule per path (a path that does not exist here is
 * skipped, as the cold kernel's init does), then restrict_self. */
void ch_landlock(double *handled, double *scoped, char **paths, double *access, int *n,
                 int *rc, char **msg) {
  *rc = 0;
  struct ruleset_attr attr = { (uint64_t)*handled, 0, (uint64_t)*scoped };
  int fd = (int)syscall(CH_LANDLOCK_CREATE_RULESET, &attr, sizeof attr, 0);
  if (fd < 0) { step_failed(rc, msg, "landlock_create_ruleset"); return; }
  for (int i = 0; i < *n; i++) {
    int pfd = open(paths[i], O_PATH | O_CLOEXEC);
    if (pfd < 0) continue;
    struct path_beneath rule = { (uint64_t)access[i], pfd };
    long r = syscall(CH_LANDLOCK_ADD_RULE, fd, 1 /* LANDLOCK_RULE_PATH_BENEATH */, &rule, 0);
    int saved = errno;
    close(pfd);
    if (r != 0) {
      errno = saved;
      char what[300];
      snprintf(what, sizeof what, "landlock_add_rule(%.256s)", paths[i]);
      step_failed(rc, msg, what);
      close(fd);
      return;
    }
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) { step_failed(rc, msg, "prctl(PR_SET_NO_NEW_PRIVS)"); close(fd); return; }
  if (syscall(CH_LANDLOCK_RESTRICT_SELF, fd, 0) != 0) { step_failed(rc, msg, "landlock_restrict_self"); close(fd); return; }
  close(fd);
}

/* Clears the ambient set, the bounding set and the effective, permitted
 * and inheritable sets. */
void ch_drop_capabilities(int *rc, char **msg) {
  *rc = 0;
  prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  int cap = 0;
  for (;; cap++) {
    int held = prctl(PR_CAPBSET_READ, cap, 0, 0, 0);
    if (held < 0) break;
    if (held == 1 && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) {
      step_failed(rc, msg, "prctl(PR_CAPBSET_DROP)");
      return;
    }
  }
  if (cap == 0) { step_failed(rc, msg, "prctl(PR_CAPBSET_READ)"); return; }
  if (capset_all(0, 0, 0) != 0) step_failed(rc, msg, "capset");
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Installs each program (hex of a struct sock_filter array, native byte
 * order), in order. */
void ch_seccomp(char **programs, int *n, int *rc, char **msg) {
  *rc = 0;
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) { step_failed(rc, msg, "prctl(PR_SET_NO_NEW_PRIVS)"); return; }
  for (int i = 0; i < *n; i++) {
    size_t len = strlen(programs[i]);
    if (len == 0 || len % 16 != 0 || len / 16 > 0xFFFF) {
      errno = EINVAL;
      step_failed(rc, msg, "seccomp: malformed program");
      return;
    }
    unsigned char *raw = malloc(len / 2);
    if (!raw) { step_failed(rc, msg, "seccomp: malloc"); return; }
    for (size_t j = 0; j < len / 2; j++) {
      int hi = hex_digit(programs[i][2 * j]), lo = hex_digit(programs[i][2 * j + 1]);
      if (hi < 0 || lo < 0) {
        free(raw);
        errno = EINVAL;
        step_failed(rc, msg, "seccomp: malformed program");
        return;
      }
      raw[j] = (unsigned char)(hi << 4 | lo);
    }
    struct sock_fprog prog = { (unsigned short)(len / 16), (struct sock_filter *)raw };
    long r = prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
    int saved = errno;
    free(raw);
    if (r != 0) { errno = saved; step_failed(rc, msg, "prctl(PR_SET_SECCOMP)"); return; }
  }
}

/* ---- R's SIGINT handler, kept armed ----
 * R installs its handler (it sets R's pending interrupt) before any user
 * code runs; native code of a package can replace it (signal(SIGINT,
 * SIG_IGN), a handler of its own) or block the signal, and R has no
 * function to put it back. ch_sigint_save records R's action (*saved 1
 * when it is a handler, 0 when SIGINT is ignored or default then);
 * ch_sigint_rearm puts it back and unblocks SIGINT when either changed
 * (*rearmed 1 then, 0 when nothing had changed or nothing was saved). */
static struct sigaction r_sigint;
static int r_sigint_saved;

void ch_sigint_save(int *saved) {
  struct sigaction cur;
  *saved = 0;
  if (sigaction(SIGINT, NULL, &cur) != 0) return;
  if (cur.sa_handler == SIG_IGN || cur.sa_handler == SIG_DFL) return;
  r_sigint = cur;
  r_sigint_saved = 1;
  *saved = 1;
}

void ch_sigint_rearm(int *rearmed) {
  *rearmed = 0;
  if (!r_sigint_saved) return;
  struct sigaction cur;
  if (sigaction(SIGINT, NULL, &cur) != 0) return;
  int changed = (cur.sa_flags & SA_SIGINFO) != (r_sigint.sa_flags & SA_SIGINFO)
    || ((cur.sa_flags & SA_SIGINFO) ? cur.sa_sigaction != r_sigint.sa_sigaction
                                    : cur.sa_handler != r_sigint.sa_handler);
  if (changed && sigaction(SIGINT, &r_sigint, NULL) == 0) *rearmed = 1;
  sigset_t mask, one;
  sigemptyset(&one);
  sigaddset(&one, SIGINT);
  if (sigprocmask(SIG_SETMASK, NULL, &mask) == 0 && sigismember(&mask, SIGINT) == 1) {
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    *rearmed = 1;
  }
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

/* The effective uid. */
void ch_geteuid(int *uid) {
  *uid = (int)geteuid();
}
