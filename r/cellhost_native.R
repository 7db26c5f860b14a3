# cellhost's native part for R (cellhost_fork.c, see there): found, or
# built with `R CMD SHLIB` (a C compiler) into <boot dir>/lib-<R version>/
# once per cache. Sourced by the template and the worker, which call
# cellhost_native(boot, build); run as a script
#   R --no-echo --no-restore --no-save -f cellhost_native.R --args <boot dir>
# it only builds (the host does that in the background for sandboxed
# kernels, whose boot directory is read-only to them).

# The loaded library's name for .C(PACKAGE =), or NULL when it is not
# built and `build` is FALSE, or is "if_possible" and the boot directory
# is not writable or an earlier build failed (the file `unbuildable` there
# says why). Errors (build = TRUE only): no compiler, or the build failed,
# with R CMD SHLIB's output.
cellhost_native <- function(boot, build = TRUE) {
  loaded <- getLoadedDLLs()
  if ("cellhost_fork" %in% names(loaded)) return("cellhost_fork")
  lib_dir <- file.path(boot, paste0("lib-", R.version$major, ".", R.version$minor))
  so <- file.path(lib_dir, paste0("cellhost_fork", .Platform$dynlib.ext))
  unbuildable <- file.path(lib_dir, "unbuildable")
  if (!file.exists(so)) {
    if (isFALSE(build)) return(NULL)
    if (identical(build, "if_possible") &&
        (file.exists(unbuildable) || !isTRUE(file.access(boot, 2L) == 0L))) return(NULL)
    build_dir <- tempfile("cellhost-fork-")
    dir.create(build_dir)
    on.exit(unlink(build_dir, recursive = TRUE), add = TRUE)
    file.copy(file.path(boot, "cellhost_fork.c"), build_dir)
    built <- file.path(build_dir, basename(so))
    old <- setwd(build_dir)
    r <- tryCatch(system2(file.path(R.home("bin"), "R"), c("CMD", "SHLIB", "cellhost_fork.c"),
                          stdout = TRUE, stderr = TRUE),
                  error = function(e) conditionMessage(e), warning = function(w) conditionMessage(w))
    setwd(old)
    if (!file.exists(built)) {
      dir.create(lib_dir, showWarnings = FALSE)
      try(writeLines(as.character(r), unbuildable), silent = TRUE)
      if (identical(build, "if_possible")) return(NULL)
      stop("cannot build cellhost's native part for R (R CMD SHLIB needs a C compiler): ",
           paste(r, collapse = "\n"))
    }
    dir.create(lib_dir, showWarnings = FALSE)
    # Copied under a name of this process's own, then renamed: a
    # concurrent start never loads half a library.
    tmp <- paste0(so, ".", Sys.getpid())
    file.copy(built, tmp, overwrite = TRUE)
    file.rename(tmp, so)
  }
  dyn.load(so)[["name"]]
}

if (length(commandArgs(trailingOnly = TRUE)) == 1L && sys.nframe() == 0L) {
  invisible(cellhost_native(commandArgs(trailingOnly = TRUE)[1L], build = TRUE))
}
