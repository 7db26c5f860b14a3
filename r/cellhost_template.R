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
# the forking thread is copied, as with parallel::mcfork. Sandboxed kernels are not
# forked from R templates (the host starts them cold).
local({
  t0 <- proc.time()[["elapsed"]]
  boot <- commandArgs(trailingOnly = TRUE)[1L]
  lib_dir <- file.path(boot, paste0("lib-", R.version$major, ".", R.version$minor))
  so <- file.path(lib_dir, paste0("cellhost_fork", .Platform$dynlib.ext))
  if (!file.exists(so)) {
    build <- tempfile("cellhost-fork-")
    dir.create(build)
    file.copy(file.path(boot, "cellhost_fork.c"), build)
    built <- file.path(build, basename(so))
    old <- setwd(build)
    r <- system2(file.path(R.home("bin"), "R"), c("CMD", "SHLIB", "cellhost_fork.c"),
                 stdout = FALSE, stderr = TRUE)
    setwd(old)
    if (!file.exists(built)) {
      stop("cannot build the template's native part (R CMD SHLIB needs a C compiler): ",
           paste(r, collapse = "\n"))
    }
    dir.create(lib_dir, showWarnings = FALSE)
    tmp <- paste0(so, ".", Sys.getpid())
    file.copy(built, tmp, overwrite = TRUE)
    file.rename(tmp, so)
  }
  dll <- dyn.load(so)
  C <- function(name, ...) .C(name, ..., PACKAGE = dll[["name"]])

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

  # Process C: becomes a fresh worker.
  become_worker <- function(req, fds) {
    s <- C("ch_worker_setup", fds, length(fds) - 4L, rc = 0L)
    if (s$rc != 0L) {
      cat("cellhost template: the ns-init ended before the mounts were ready\n", file = stderr())
      .Internal(quit("no", 72L, FALSE))
    }
    # The kernel's environment, with what R's front end set for itself
    # (R_HOME, R_SHARE_DIR, LD_LIBRARY_PATH, ...) as a cold R has it.
    all <- Sys.getenv()
    keep <- grepl("^R_|^LD_LIBRARY_PATH$", names(all))
    Sys.unsetenv(names(all)[!keep])
    env <- req$env
    if (length(env) > 0L) do.call(Sys.setenv, lapply(env, as.character))
    if (!is.null(req$cwd)) setwd(req$cwd)
    parent <- Sys.getenv("TMPDIR", "/tmp")
    if (!nzchar(parent)) parent <- "/tmp"
    if (C("ch_new_tempdir", parent, path = "", rc = 0L)$rc != 0L) {
      cat("cellhost template: worker: cannot create a temporary directory under ", parent, "\n",
          sep = "", file = stderr())
      .Internal(quit("no", 72L, FALSE))
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
    if (length(fds) != 4L) {
      if (length(fds)) C("ch_close", fds, length(fds))
      return(list(type = "fork_failed", id = req$id,
                  error = sprintf("expected 4 descriptors, got %d", length(fds))))
    }
    if (!identical(req$plan$mode, "off") && !is.null(req$plan$mode)) {
      C("ch_close", fds, 4L)
      return(list(type = "fork_failed", id = req$id,
                  error = "an R template forks unsandboxed kernels only"))
    }
    spec <- as.character(jsonlite::toJSON(list(spec = req$spec, kernel_id = NULL),
                                          auto_unbox = TRUE, null = "null"))
    cg <- vapply(req$cgroup_procs, as.character, "")
    r <- C("ch_fork_kernel", fds, as.character(req$launcher), spec, cg, length(cg),
           out = integer(4L + length(cg)), pid = -1L, rc = 0L)
    if (r$pid == 0L) become_worker(req, r$out)
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
