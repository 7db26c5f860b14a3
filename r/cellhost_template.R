# cellhost's R template: a fork server with the configured packages
# attached (see crates/kernel/src/template.rs and the Python template,
# whose wire protocol this speaks).
#
# Started like the worker (the control socket on fd 0) as
#   R --no-echo --no-restore --no-save -f cellhost_template.R --args <boot dir>
# * template -> host, once: {"type": "template_ready", "pid", "preloaded",
#   "failed", "import_ms", "threads"}
# * host -> template: {"type": "fork", "id", "launcher", "plan", "spec",
#   "cgroup_procs", "env", "cwd"} with four descriptors (control socket,
#   stdout, stderr, status pipe) attached.
# * template -> host: {"type": "forked", "id", "pid"} or
#   {"type": "fork_failed", "id", "error"}.
# Each fork is process A (the kernel init: starts the ns-init, forks the
# worker C, execs the Rust init in adopt mode) and C, which puts its
# descriptors in place and evaluates the worker script as a fresh worker
# does. The system calls are in cellhost_fork.c (built with R CMD SHLIB on
# first use). The template runs no user code. Threads a package started in
# the template (reported as "threads") are not in the forked kernels: only
# the forking thread is copied, as with parallel::mcfork. A sandboxed
# fork applies the plan's confinement steps (cellhost_sandbox::forkplan):
# rlimits and namespaces (a user namespace of its own first when not
# root) in A, the mounts in the ns-init, the cgroups and cgroup namespace,
# bounding set, uid, Landlock, capabilities and seccomp in C, which then
# reports its layers in a `sandbox` frame as a forked Python kernel does.
local({
  t0 <- proc.time()[["elapsed"]]
  boot <- commandArgs(trailingOnly = TRUE)[1L]
  native <- new.env(parent = baseenv())
  sys.source(file.path(boot, "cellhost_native.R"), envir = native)
  dll <- native$cellhost_native(boot, build = TRUE)
  C <- function(name, ...) .C(name, ..., PACKAGE = dll)

  taken <- C("ch_take_socket", fd = 0L, rc = 0L)
  if (taken$rc != 0L) stop("cannot take the control socket")
  sock <- taken$fd
  buf <- raw(0)
  held <- integer(0)

  # The next line (raw bytes) with the descriptors that came with it, or
  # NULL at EOF.
  next_line <- function() {
    repeat {
      nl <- match(as.raw(10L), buf)
      if (!is.na(nl)) {
        line <- buf[seq_len(nl - 1L)]
        buf <<- buf[-seq_len(nl)]
        fds <- held
        held <<- integer(0)
        return(list(line = line, fds = fds))
      }
      r <- C("ch_recv", sock, raw(65536L), 65536L, len = 0L, fds = integer(4L), nfds = 0L, rc = 0L)
      if (r$rc != 0L || r$len == 0L) return(NULL)
      buf <<- c(buf, r[[2L]][seq_len(r$len)])
      if (length(buf) > 1048576L) return(NULL)
      held <<- c(held, r$fds[seq_len(r$nfds)])
    }
  }
  reply <- function(frame) {
    bytes <- c(charToRaw(enc2utf8(as.character(
      jsonlite::toJSON(frame, auto_unbox = TRUE, null = "null")))), as.raw(10L))
    C("ch_send", sock, bytes, length(bytes), rc = 0L)
  }
  parse_line <- function(line) {
    tryCatch(jsonlite::fromJSON(rawToChar(line), simplifyVector = FALSE),
             error = function(e) NULL)
  }

  # The configuration: its length in decimal, a newline, JSON (as the
  # worker reads it).
  first <- next_line()
  if (is.null(first)) .Internal(quit("no", 0L, FALSE))
  n <- suppressWarnings(as.integer(rawToChar(first$line)))
  if (length(n) != 1L || is.na(n) || n < 0L || n > 1048576L) stop("bad configuration header")
  while (length(buf) < n) {
    r <- C("ch_recv", sock, raw(65536L), 65536L, len = 0L, fds = integer(4L), nfds = 0L, rc = 0L)
    if (r$rc != 0L || r$len == 0L) .Internal(quit("no", 0L, FALSE))
    buf <- c(buf, r[[2L]][seq_len(r$len)])
  }
  config <- parse_line(buf[seq_len(n)])
  buf <- buf[-seq_len(n)]
  if (!is.list(config)) config <- list()
  worker <- parse(file.path(boot, "cellhost_worker.R"), keep.source = FALSE)
  loadNamespace("jsonlite")
  preloaded <- character(0)
  failed <- structure(list(), names = character(0))
  for (pkg in vapply(config$preload, as.character, "")) {
    ok <- tryCatch({
      suppressPackageStartupMessages(library(pkg, character.only = TRUE))
      TRUE
    }, error = function(e) conditionMessage(e))
    if (isTRUE(ok)) preloaded <- c(preloaded, pkg) else failed[[pkg]] <- ok
  }
  reply(list(type = "template_ready", pid = Sys.getpid(), preloaded = I(preloaded),
             failed = failed, import_ms = round((proc.time()[["elapsed"]] - t0) * 1000, 1),
             threads = length(list.files("/proc/self/task"))))

  # The process that runs each confinement step (cellhost_sandbox::steps::Step::stage).
  STAGES <- c(rlimits = "init", namespaces = "init", mounts = "ns_init", bounding_set = "worker",
              uid = "worker", landlock = "worker", capabilities = "worker", seccomp = "worker")
  CLONE_NEWCGROUP <- 0x02000000

  layer <- function(name, enforced, detail) list(name = name, enforced = enforced, detail = detail)

  # The worker's steps of the plan, in the plan's order; the layers they
  # leave (as confine.py's caller reports them).
  confine_worker <- function(plan, steps, kid, idmap_failures) {
    layers <- list()
    add <- function(l) layers[[length(layers) + 1L]] <<- l
    for (step in steps) {
      if (step == "bounding_set") {
        if (isTRUE(plan$drop_capabilities)) C("ch_drop_bounding_set", rc = 0L)
      } else if (step == "uid") {
        euid <- C("ch_geteuid", uid = 0L)$uid
        add(if (euid != 0L) {
          layer("uid", TRUE, sprintf("runs as host uid %d, not root", euid))
        } else if (kid < 0L) {
          layer("uid", FALSE, if (is.null(plan$uid_missing))
            "no kernel uid was chosen: the kernel runs as root" else plan$uid_missing)
        } else {
          r <- C("ch_become_id", kid, rc = 0L, msg = "")
          if (r$rc != 0L) layer("uid", FALSE, sprintf("cannot take uid %d: %s", kid, r$msg))
          else if (length(idmap_failures)) {
            layer("uid", FALSE, sprintf("runs as uid %d, but cannot write %s (no idmapped mount)",
                                        kid, paste(unlist(idmap_failures), collapse = "; ")))
          } else {
            layer("uid", TRUE, sprintf(paste0(
              "runs as uid %d and gid %d (one per kernel, no host account, not root), ",
              "no supplementary groups; read-write paths idmapped to it"), kid, kid))
          }
        })
      } else if (step == "landlock") {
        ll <- plan$landlock
        add(if (is.null(ll)) {
          layer("landlock", FALSE, if (is.null(plan$landlock_missing)) "not applied" else plan$landlock_missing)
        } else {
          paths <- vapply(ll$rules, function(x) as.character(x[[1L]]), "")
          access <- vapply(ll$rules, function(x) as.double(x[[2L]]), 0)
          r <- C("ch_landlock", as.double(ll$handled_fs), as.double(ll$scoped), paths, access,
                 length(paths), rc = 0L, msg = "")
          if (r$rc == 0L) layer("landlock", TRUE, ll$detail)
          else layer("landlock", FALSE, paste("ruleset failed:", r$msg))
        })
      } else if (step == "capabilities") {
        add(if (!isTRUE(plan$drop_capabilities)) {
          layer("capabilities", FALSE, "disabled by the sandbox profile")
        } else {
          r <- C("ch_drop_capabilities", rc = 0L, msg = "")
          if (r$rc == 0L) layer("capabilities", TRUE, "all dropped (bounding set cleared)")
          else layer("capabilities", FALSE, r$msg)
        })
      } else if (step == "seccomp") {
        progs <- vapply(plan$seccomp, as.character, "")
        add(if (length(progs) == 0L) {
          layer("seccomp", FALSE, if (is.null(plan$seccomp_detail) || !nzchar(plan$seccomp_detail))
            "disabled by the sandbox profile" else plan$seccomp_detail)
        } else {
          r <- C("ch_seccomp", progs, length(progs), rc = 0L, msg = "")
          if (r$rc == 0L) layer("seccomp", TRUE, plan$seccomp_detail)
          else layer("seccomp", FALSE, paste("cannot install the filter:", r$msg))
        })
      } else {
        stop("no implementation of the worker step ", step)
      }
    }
    layers
  }

  # The plan's layers, each replaced by the ns-init's report of it.
  merge_layers <- function(plan_layers, updates) {
    names_of <- function(ls) vapply(ls, function(l) as.character(l$name), "")
    un <- names_of(updates)
    merged <- lapply(plan_layers, function(l) {
      i <- match(as.character(l$name), un)
      if (is.na(i)) l else updates[[i]]
    })
    c(merged, updates[!(un %in% names_of(plan_layers))])
  }

  die72 <- function(...) {
    cat("cellhost template: ", ..., "\n", sep = "", file = stderr())
    .Internal(quit("no", 72L, FALSE))
  }

  # Process C: confines itself and becomes a fresh worker.
  become_worker <- function(req, fds, steps, kid) {
    plan <- req$plan
    n_cg <- length(fds) - 4L
    cgroupns <- as.integer(bitwAnd(as.integer(if (is.null(plan$unshare)) 0L else plan$unshare),
                                   CLONE_NEWCGROUP) != 0L)
    s <- C("ch_worker_setup", fds, n_cg, cgroupns, go = raw(65536L), 65536L, len = 0L, rc = 0L)
    if (s$rc == -1L) die72("the ns-init ended before the mounts were ready")
    if (s$rc != 0L) die72("worker: unshare(CLONE_NEWCGROUP) failed (errno ", -s$rc, ")")
    go <- parse_line(s$go[seq_len(s$len)])
    if (!is.list(go)) die72("the ns-init's go message is not a JSON object")
    # The kernel's environment, with what R's front end set for itself
    # (R_HOME, R_SHARE_DIR, LD_LIBRARY_PATH, ...) as a cold R has it.
    all <- Sys.getenv()
    keep <- grepl("^R_|^LD_LIBRARY_PATH$", names(all))
    Sys.unsetenv(names(all)[!keep])
    env <- req$env
    if (length(env) > 0L) do.call(Sys.setenv, lapply(env, as.character))
    if (!is.null(req$cwd)) setwd(req$cwd)
    mode <- if (is.null(plan$mode)) "off" else as.character(plan$mode)
    if (mode != "off") {
      layers <- merge_layers(if (is.null(plan$layers)) list() else plan$layers,
                             if (is.null(go$layers)) list() else go$layers)
      layers <- c(layers, confine_worker(plan, steps[STAGES[steps] == "worker"], kid,
                                         go$idmap_failures))
      frame <- list(type = "sandbox", mode = mode, layers = layers)
      bytes <- c(charToRaw(enc2utf8(as.character(
        jsonlite::toJSON(frame, auto_unbox = TRUE, null = "null")))), as.raw(10L))
      C("ch_send", 0L, bytes, length(bytes), rc = 0L)
      if (mode == "enforce" && any(vapply(layers, function(l) {
        !isTRUE(l$enforced) && !isTRUE(l$optional)
      }, TRUE))) {
        .Internal(quit("no", 72L, FALSE))
      }
    }
    parent <- Sys.getenv("TMPDIR", "/tmp")
    if (!nzchar(parent)) parent <- "/tmp"
    if (C("ch_new_tempdir", parent, path = "", rc = 0L)$rc != 0L) {
      die72("worker: cannot create a temporary directory under ", parent)
    }
    # A fork shares its parent's random state: R seeds a fresh one (from
    # the time and the new pid) once .Random.seed is gone.
    if (exists(".Random.seed", envir = globalenv(), inherits = FALSE)) {
      rm(".Random.seed", envir = globalenv())
    }
    for (e in worker) eval(e, globalenv())
    .Internal(quit("no", 0L, FALSE))
  }

  fork <- function(req, fds) {
    failed <- function(error) {
      if (length(fds)) C("ch_close", fds, length(fds))
      list(type = "fork_failed", id = req$id, error = error)
    }
    if (length(fds) != 4L) return(failed(sprintf("expected 4 descriptors, got %d", length(fds))))
    plan <- req$plan
    if (!is.list(plan)) return(failed("the fork request has no plan"))
    steps <- vapply(plan$steps, as.character, "")
    if (length(steps) == 0L) return(failed("the fork plan names no confinement steps"))
    unknown <- setdiff(steps, names(STAGES))
    # An older template must not confine a kernel partly.
    if (length(unknown)) return(failed(paste("unknown confinement step", unknown[1L])))
    init_steps <- steps[STAGES[steps] == "init"]
    rl <- if (is.null(plan$rlimits)) list() else plan$rlimits
    rl_names <- vapply(rl, function(x) as.character(x[[1L]]), "")
    rl_values <- vapply(rl, function(x) as.double(x[[2L]]), 0)
    userns <- if (is.null(plan$user_ns)) c(-1L, -1L)
              else c(as.integer(plan$user_ns$uid), as.integer(plan$user_ns$gid))
    uid_base <- if (is.null(plan$uid_base)) -1 else as.double(plan$uid_base)
    spec <- if (is.null(req$spec)) "null" else as.character(jsonlite::toJSON(
      req$spec, auto_unbox = TRUE, null = "null", digits = NA))
    cg <- vapply(req$cgroup_procs, as.character, "")
    r <- C("ch_fork_kernel", fds, as.character(req$launcher), spec, cg, length(cg),
           init_steps, length(init_steps), as.integer(if (is.null(plan$unshare)) 0L else plan$unshare),
           rl_names, rl_values, length(rl_names), userns, uid_base,
           out = integer(4L + length(cg)), kid = -1L, pid = -1L, rc = 0L)
    if (r$pid == 0L) become_worker(req, r$out, steps, r$kid)
    C("ch_close", fds, 4L)
    if (r$rc != 0L) return(list(type = "fork_failed", id = req$id, error = "fork failed"))
    list(type = "forked", id = req$id, pid = r$pid)
  }

  repeat {
    got <- next_line()
    if (is.null(got)) .Internal(quit("no", 0L, FALSE))
    req <- parse_line(got$line)
    if (!is.list(req) || !identical(req$type, "fork")) {
      if (length(got$fds)) C("ch_close", got$fds, length(got$fds))
      reply(list(type = "fork_failed", id = if (is.list(req)) req$id else NULL,
                 error = "bad request: not a fork request"))
      next
    }
    reply(fork(req, got$fds))
  }
}, envir = new.env(parent = baseenv()))
