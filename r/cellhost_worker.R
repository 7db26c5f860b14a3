# cellhost's R worker: protocol v1 (see DESIGN.md, "Worker protocol v1").
#
# Started by crates/kernel/src/runtime/r.rs as
#   sh -c 'exec R --no-echo --no-restore --no-save -f <this file> 0<&3 3<&-'
# so the control socket is fd 0 when this file starts: R can open a
# descriptor only as file("stdin"), which dup()s fd 0. Both ends of the
# channel are opened that way, then fd 0 is closed and /dev/null opened in
# its place (the lowest free descriptor), so user code and its children see
# no stdin.
#
# Everything lives in one environment whose parent is base: nothing of the
# worker is visible in the global environment, and a user binding of
# `print`, `cat` or `list` there does not reach the worker's own code.
local({
  PROTOCOL <- 1L

  inp <- file("stdin", open = "rb")
  out <- file("stdin", open = "wb")
  parallel:::closeFD(0L)
  devnull <- file("/dev/null", open = "r")

  exit_now <- function() .Internal(quit("no", 0L, FALSE))

  # The native part (cellhost_native.R): a forked worker has it loaded
  # already; a cold one loads it from the boot directory, building it when
  # that directory is writable. Without it (no C compiler, or a sandboxed
  # kernel before the host's background build is done) R's SIGINT handler
  # cannot be re-armed.
  native <- local({
    if ("cellhost_fork" %in% names(getLoadedDLLs())) return("cellhost_fork")
    args <- commandArgs()
    i <- match("-f", args)
    if (is.na(i) || i >= length(args)) return(NULL)
    boot <- dirname(args[i + 1L])
    f <- file.path(boot, "cellhost_native.R")
    if (!file.exists(f)) return(NULL)
    e <- new.env(parent = baseenv())
    tryCatch({
      sys.source(f, envir = e)
      e$cellhost_native(boot, build = "if_possible")
    }, error = function(err) NULL)
  })
  # R's own SIGINT handler, recorded before any user code runs.
  sigint_saved <- !is.null(native) &&
    isTRUE(.C("ch_sigint_save", saved = 0L, PACKAGE = native)$saved == 1L)
  # Puts R's handler back (and unblocks SIGINT) when native code of a
  # package replaced it; TRUE when it had to.
  rearm_sigint <- function() {
    sigint_saved && isTRUE(.C("ch_sigint_rearm", rearmed = 0L, PACKAGE = native)$rearmed == 1L)
  }
  pending <- list()         # frames read while waiting for a host_response
  current <- NULL           # id of the running cell
  execution_count <- 0L
  call_ids <- 0L
  tool_names <- character(0)
  plot_dir <- NULL
  plot_devices <- integer(0)
  plot_seq <- 0L
  cell_warnings <- list()

  json_out <- function(x) {
    jsonlite::toJSON(x, auto_unbox = TRUE, null = "null", na = "null",
                     digits = NA, force = TRUE)
  }

  send <- function(frame) {
    data <- tryCatch(json_out(frame), error = function(e) NULL)
    if (is.null(data)) {
      frame$result <- NULL
      frame$data <- list("text/plain" = "<output could not be encoded as JSON>")
      data <- json_out(frame)
    }
    bytes <- c(charToRaw(enc2utf8(as.character(data))), as.raw(10L))
    suspendInterrupts({
      writeBin(bytes, out)
      flush(out)
    })
    invisible(TRUE)
  }

  log_msg <- function(msg) send(list(type = "log", msg = paste(msg, collapse = " ")))

  # The next frame (a list), or NULL at EOF. Lines that are not one JSON
  # object are skipped.
  read_frame <- function() {
    repeat {
      line <- readLines(inp, n = 1L, warn = FALSE, encoding = "UTF-8")
      if (length(line) == 0L) return(NULL)
      if (!nzchar(line)) next
      frame <- tryCatch(jsonlite::fromJSON(line, simplifyVector = FALSE),
                        error = function(e) NULL)
      if (is.list(frame) && !is.null(frame$type)) return(frame)
      log_msg(sprintf("worker: malformed control frame skipped (%d bytes)", nchar(line, "bytes")))
    }
  }

  next_frame <- function() {
    if (length(pending) > 0L) {
      f <- pending[[1L]]
      pending <<- pending[-1L]
      return(f)
    }
    read_frame()
  }

  read_config <- function() {
    header <- readLines(inp, n = 1L, warn = FALSE)
    n <- suppressWarnings(as.integer(header))
    if (length(n) != 1L || is.na(n) || n <= 0L) return(list())
    body <- readChar(inp, n, useBytes = TRUE)
    cfg <- tryCatch(jsonlite::fromJSON(body, simplifyVector = FALSE), error = function(e) NULL)
    if (is.list(cfg)) cfg else list()
  }

  # ---- output streams and markers --------------------------------------

  reset_sinks <- function() {
    while (sink.number() > 0L) sink()
    if (sink.number(type = "message") != 2L) sink(type = "message")
  }

  write_marker <- function(m) {
    reset_sinks()
    cat(m, file = stdout())
    flush(stdout())
    cat(m, file = stderr())
    flush(stderr())
  }

  start_marker <- function(m) sub("cellhost-end-", "cellhost-start-", m, fixed = TRUE)

  # ---- plots ------------------------------------------------------------

  # Every device a cell opens without naming one is a PNG device writing one
  # file per page under the cell's plot directory; the files are sent as
  # image/png displays at the cell's end. A user dev.off() only closes one
  # device early: its pages are already files.
  open_device <- function(...) {
    plot_seq <<- plot_seq + 1L
    dir <- plot_dir
    if (is.null(dir)) {
      dir <- tempfile("cellhost-plots-")
      dir.create(dir, showWarnings = FALSE)
      plot_dir <<- dir
    }
    path <- file.path(dir, sprintf("d%04d-p%%04d.png", plot_seq))
    w <- getOption("cellhost.plot.width", 7)
    h <- getOption("cellhost.plot.height", 5)
    res <- getOption("cellhost.plot.res", 96)
    grDevices::png(filename = path, width = w, height = h, units = "in", res = res, type = "cairo")
    plot_devices <<- c(plot_devices, grDevices::dev.cur())
    invisible(NULL)
  }

  flush_plots <- function(id) {
    for (d in plot_devices) {
      if (d %in% grDevices::dev.list()) try(grDevices::dev.off(d), silent = TRUE)
    }
    plot_devices <<- integer(0)
    dir <- plot_dir
    if (is.null(dir)) return(invisible(NULL))
    files <- sort(list.files(dir, pattern = "\\.png$", full.names = TRUE))
    for (f in files) {
      size <- file.info(f)$size
      if (!is.na(size) && size > 0) {
        png <- readBin(f, "raw", n = size)
        send(list(type = "display", id = id,
                  data = list("image/png" = gsub("[\r\n]", "", jsonlite::base64_enc(png)),
                              "text/plain" = "<R plot>"),
                  metadata = structure(list(), names = character(0))))
      }
      unlink(f)
    }
    invisible(NULL)
  }

  # ---- values -----------------------------------------------------------

  print_value <- function(v) {
    if (isS4(v)) methods::show(v) else print(v)
  }

  html_escape <- function(x) {
    x <- gsub("&", "&amp;", x, fixed = TRUE)
    x <- gsub("<", "&lt;", x, fixed = TRUE)
    gsub(">", "&gt;", x, fixed = TRUE)
  }

  html_table <- function(df, max_rows = 50L) {
    n <- nrow(df)
    shown <- if (n > max_rows) df[seq_len(max_rows), , drop = FALSE] else df
    cells <- as.matrix(format(shown))
    if (ncol(cells) == 0L) return(NULL)
    head <- paste0("<th></th>", paste0("<th>", html_escape(names(df)), "</th>", collapse = ""))
    rows <- vapply(seq_len(nrow(cells)), function(i) {
      paste0("<tr><th>", html_escape(rownames(shown)[i]), "</th>",
             paste0("<td>", html_escape(cells[i, ]), "</td>", collapse = ""), "</tr>")
    }, "")
    note <- if (n > max_rows) sprintf("\n<p>%d rows &times; %d columns (first %d shown)</p>", n, ncol(df), max_rows) else ""
    paste0("<table class=\"dataframe\">\n<thead><tr>", head, "</tr></thead>\n<tbody>\n",
           paste(rows, collapse = "\n"), "\n</tbody>\n</table>", note)
  }

  # The MIME bundle of a cell's last visible value: what print() shows, and
  # an HTML table for data frames. NULL when printing shows nothing (a plot
  # object, which printing draws).
  bundle <- function(v) {
    text <- utils::capture.output(print_value(v))
    if (length(text) == 0L) return(NULL)
    data <- list("text/plain" = paste(text, collapse = "\n"))
    if (is.data.frame(v)) {
      html <- tryCatch(html_table(v), error = function(e) NULL)
      if (!is.null(html)) data[["text/html"]] <- html
    }
    data
  }

  # ---- conditions -------------------------------------------------------

  # A condition signalled by a cell's top-level expression carries the
  # worker's eval as its call; the console shows none there.
  EVAL_CALL <- quote(eval(expr, envir = globalenv()))

  call_text <- function(call) {
    if (is.null(call) || identical(call, EVAL_CALL)) return(NULL)
    paste(deparse(call, nlines = 1L, width.cutoff = 80L), collapse = " ")
  }

  warning_lines <- function(ws) {
    if (length(ws) == 0L) return(character(0))
    fmt <- function(w) {
      call <- call_text(conditionCall(w))
      msg <- conditionMessage(w)
      if (is.null(call)) msg else paste0("In ", call, " : ", msg)
    }
    if (length(ws) == 1L) return(c("Warning message:", fmt(ws[[1L]])))
    if (length(ws) > 10L) {
      return(sprintf("There were %d warnings (use warnings() to see them)", length(ws)))
    }
    c("Warning messages:", paste0(seq_along(ws), ": ", vapply(ws, fmt, "")))
  }

  # The user frames of the calls active when a condition was signalled:
  # those below the worker's eval of the cell's expression, without the
  # condition machinery on top.
  user_calls <- function(calls) {
    marks <- which(vapply(calls, function(cl) identical(cl[[1L]], quote(cellhost_eval)), NA))
    if (length(marks) == 0L) return(list())
    calls <- calls[-seq_len(marks[length(marks)])]
    while (length(calls) > 0L && identical(calls[[1L]][[1L]], quote(eval))) calls <- calls[-1L]
    machinery <- c("stop", "warning", ".handleSimpleError", "h", "signalCondition",
                   "doTryCatch", "withCallingHandlers", "simpleError", "stopifnot")
    while (length(calls) > 0L) {
      head <- calls[[length(calls)]][[1L]]
      if (is.symbol(head) && as.character(head) %in% machinery) calls <- calls[-length(calls)]
      else break
    }
    calls
  }

  error_of <- function(e, calls, expr_text) {
    call <- call_text(conditionCall(e))
    msg <- conditionMessage(e)
    head <- if (is.null(call)) paste0("Error: ", msg) else paste0("Error in ", call, " : ", msg)
    tb <- head
    if (length(calls) > 0L) {
      tb <- c(tb, "Traceback:", paste0(seq_along(calls), ". ",
                                      vapply(calls, function(cl) call_text(cl), "")))
    }
    if (!is.null(expr_text)) tb <- c(tb, paste0("In the cell's expression: ", expr_text))
    list(ename = class(e)[1L], evalue = msg, traceback = I(tb))
  }

  # ---- cells ------------------------------------------------------------

  cellhost_eval <- function(expr) eval(expr, envir = globalenv())

  usage <- function(before) {
    t <- proc.time()
    cpu <- sum(t[c(1L, 2L, 4L, 5L)], na.rm = TRUE)
    rss <- tryCatch({
      s <- readLines("/proc/self/status", warn = FALSE)
      hwm <- grep("^VmHWM:", s, value = TRUE)
      as.numeric(gsub("[^0-9]", "", hwm))
    }, error = function(e) NA)
    list(cpu_s = round(cpu - before, 6), peak_rss_kb = if (length(rss) == 1L) rss else NA)
  }

  # What the process does with SIGINT now, from /proc/self/status: R's own
  # handler ("worker"), or what native code of a package set in its place
  # ("ignored", "default") — put back before the next cell (rearm_sigint).
  sigint_handler <- function() {
    s <- tryCatch(readLines("/proc/self/status", warn = FALSE), error = function(e) character(0))
    bit <- function(field) {
      line <- grep(paste0("^", field, ":"), s, value = TRUE)
      if (length(line) != 1L) return(NA)
      hex <- sub("^[^:]*:[[:space:]]*", "", line)
      # SIGINT is signal 2: bit 1 of the mask's last hex digit.
      digit <- strtoi(substr(hex, nchar(hex), nchar(hex)), 16L)
      !is.na(digit) && bitwAnd(digit, 2L) != 0L
    }
    if (isTRUE(bit("SigIgn"))) "ignored"
    else if (isTRUE(bit("SigCgt"))) "worker"
    else if (identical(bit("SigCgt"), FALSE)) "default"
    else "worker"
  }

  cpu_now <- function() sum(proc.time()[c(1L, 2L, 4L, 5L)], na.rm = TRUE)

  run_cell <- function(frame) {
    id <- as.character(frame$id)
    code <- if (is.character(frame$code)) frame$code else ""
    marker <- if (is.character(frame$marker)) frame$marker else ""
    silent <- isTRUE(frame$options$silent)
    current <<- id
    # Interrupt keeps the session even after native code replaced R's
    # SIGINT handler in an earlier cell: re-armed before this one runs.
    if (rearm_sigint()) log_msg("worker: R's SIGINT handler re-armed (native code had replaced it)")
    if (!silent) execution_count <<- execution_count + 1L
    cell_warnings <<- list()
    cpu_before <- cpu_now()
    state <- new.env(parent = emptyenv())
    state$status <- "ok"
    state$result <- NULL
    state$error <- NULL
    state$calls <- NULL
    state$expr_text <- NULL
    on_warning <- function(w) {
      level <- getOption("warn", 0)
      if (is.numeric(level) && level >= 1) {
        cat(paste(sub("^Warning message:$", "Warning:", warning_lines(list(w))), collapse = "\n"),
            "\n", sep = "", file = stderr())
      } else if (!is.numeric(level) || level >= 0) {
        cell_warnings[[length(cell_warnings) + 1L]] <<- w
      }
      invokeRestart("muffleWarning")
    }
    on_error <- function(e) state$calls <- user_calls(sys.calls())
    tryCatch(withCallingHandlers({
      # `started` tells the host its wake-up may come now: the handlers
      # above are in place, and a SIGINT that lands while the frame and
      # the start marker are written is held until both are out, then
      # ends the cell as interrupted.
      suspendInterrupts({
        send(list(type = "started", id = id))
        write_marker(start_marker(marker))
      })
      exprs <- parse(text = code, keep.source = TRUE)
      srcref <- attr(exprs, "srcref")
      n <- length(exprs)
      for (i in seq_len(n)) {
        state$expr_text <- if (!is.null(srcref)) {
          paste(as.character(srcref[[i]])[1L], if (length(as.character(srcref[[i]])) > 1L) "..." else "")
        } else call_text(exprs[[i]])
        vis <- withVisible(cellhost_eval(exprs[[i]]))
        if (vis$visible) {
          if (i < n) print_value(vis$value) else state$result <- bundle(vis$value)
        }
      }
    }, warning = on_warning, error = on_error),
    cellhost_quit = function(q) {
      cat("quit() ends the cell; the session is kept (restart the session to start afresh)\n",
          file = stderr())
    },
    interrupt = function(i) {
      state$status <- "interrupted"
      state$error <- list(ename = "interrupt", evalue = "", traceback = I(character(0)))
    },
    error = function(e) {
      state$status <- "error"
      state$error <- error_of(e, if (is.null(state$calls)) list() else state$calls,
                              if (inherits(e, "parseError") || is.null(state$expr_text)) NULL
                              else trimws(state$expr_text))
    })
    end_cell(id, marker, state$status, state$result, state$error, cpu_before)
  }

  end_cell <- function(id, marker, status, result, error, cpu_before) {
    for (attempt in 1:3) {
      done <- tryCatch({
        reset_sinks()
        flush_plots(id)
        lines <- warning_lines(cell_warnings)
        cell_warnings <<- list()
        if (length(lines) > 0L) cat(paste(lines, collapse = "\n"), "\n", sep = "", file = stderr())
        flush(stdout())
        current <<- NULL
        write_marker(marker)
        send(list(type = "response", id = id, status = status,
                  execution_count = execution_count, result = result, error = error,
                  usage = usage(cpu_before), cwd = tryCatch(getwd(), error = function(e) NULL),
                  sigint_handler = sigint_handler()))
        TRUE
      }, interrupt = function(i) FALSE, error = function(e) {
        log_msg(paste("worker: the end of a cell failed:", conditionMessage(e)))
        FALSE
      })
      if (isTRUE(done)) return(invisible(NULL))
      status <- if (status == "ok") "interrupted" else status
    }
  }

  # ---- variables --------------------------------------------------------

  describe <- function(name, env) {
    if (bindingIsActive(name, env)) return(list(name = name, type = "active binding"))
    x <- get(name, envir = env)
    info <- list(name = name, type = paste(class(x), collapse = "/"))
    d <- if (is.data.frame(x) || !is.object(x)) dim(x) else NULL
    if (!is.null(d)) info$shape <- I(as.integer(d))
    if (!is.object(x) || is.data.frame(x)) info$len <- length(x)
    if (is.data.frame(x)) info$columns <- I(utils::head(names(x), 50L))
    if (is.atomic(x) && !is.object(x)) info$dtype <- typeof(x)
    if (is.atomic(x) && !is.object(x) && length(x) == 1L) {
      info$preview <- substr(paste(deparse(x, nlines = 1L), collapse = ""), 1L, 120L)
    }
    size <- tryCatch(as.numeric(utils::object.size(x)), error = function(e) NULL)
    if (!is.null(size)) info$size_bytes <- size
    info
  }

  inspect <- function(frame) {
    limit <- suppressWarnings(as.integer(frame$limit))
    if (length(limit) != 1L || is.na(limit)) limit <- 100L
    limit <- max(1L, min(500L, limit))
    names <- ls(globalenv(), sorted = TRUE)
    vars <- lapply(utils::head(names, limit), function(n) {
      tryCatch(describe(n, globalenv()), error = function(e) {
        list(name = n, type = "?", error = conditionMessage(e))
      })
    })
    send(list(type = "variables", id = frame$id, variables = I(vars),
              truncated = length(names) > limit))
  }

  # ---- host tools (cellhost::tools$name(...)) ----------------------------

  host_call <- function(name, args = list()) {
    if (is.null(current)) {
      stop("host call from outside a running cell: a cell's tool authority ends when the cell settles", call. = FALSE)
    }
    if (!is.list(args)) stop("host call arguments must be a named list", call. = FALSE)
    if (length(args) == 0L) args <- structure(list(), names = character(0))
    call_ids <<- call_ids + 1L
    cid <- paste0("h", call_ids)
    send(list(type = "host_call", id = cid, cell = current, method = name, args = args))
    repeat {
      f <- read_frame()
      if (is.null(f)) exit_now()
      if (identical(f$type, "host_response") && identical(f$id, cid)) break
      pending[[length(pending) + 1L]] <<- f
    }
    if (!is.null(f$error)) {
      stop(structure(class = c("cellhost_tool_error", "error", "condition"),
                     list(message = as.character(f$error), call = NULL)))
    }
    jsonlite::fromJSON(jsonlite::toJSON(f$data, auto_unbox = TRUE, null = "null"))
  }

  make_tools <- function(names) {
    tools <- new.env(parent = emptyenv())
    for (n in names) {
      local({
        tool <- n
        assign(tool, function(...) host_call(tool, list(...)), envir = tools)
      })
    }
    lockEnvironment(tools, bindings = TRUE)
    tools
  }

  display <- function(x) {
    if (is.null(current)) stop("display() outside a running cell", call. = FALSE)
    data <- bundle(x)
    if (!is.null(data)) {
      send(list(type = "display", id = current, data = data,
                metadata = structure(list(), names = character(0))))
    }
    invisible(x)
  }

  # A namespace named `cellhost`, so cells write cellhost::tools$name(...),
  # cellhost::call("name", list(...)) and cellhost::display(x) without any
  # package installed.
  register_api <- function() {
    ns <- new.env(parent = baseenv())
    info <- new.env(parent = baseenv())
    assign(".__NAMESPACE__.", info, envir = ns)
    info$spec <- c(name = "cellhost", version = "1.0.0")
    exports <- new.env(parent = baseenv())
    api <- list(tools = make_tools(tool_names), call = host_call, display = display)
    for (n in names(api)) {
      assign(n, api[[n]], envir = ns)
      assign(n, n, envir = exports)
    }
    info$exports <- exports
    info$imports <- list(base = TRUE)
    # find.package() reads a DESCRIPTION under every loaded namespace's
    # path: base's keeps help() and friends quiet.
    info$path <- system.file(package = "base")
    info$dynlibs <- character(0)
    info$S3methods <- matrix(character(0), ncol = 4L)
    info$lazydata <- new.env(parent = baseenv())
    lockEnvironment(ns, bindings = TRUE)
    .Internal(registerNamespace("cellhost", ns))
  }

  # ---- the console's interactive functions ------------------------------

  replace_base <- function(name, fn, envs = list(baseenv())) {
    for (env in envs) {
      if (!exists(name, envir = env, inherits = FALSE)) next
      unlockBinding(name, env)
      assign(name, fn, envir = env)
      lockBinding(name, env)
    }
  }

  ends_cell <- function(save = "default", status = 0, runLast = TRUE) {
    stop(structure(class = c("cellhost_quit", "condition"),
                   list(message = "quit", call = NULL)))
  }

  no_input <- function(what) {
    force(what)
    function(...) {
      stop(sprintf("%s is not supported: cellhost kernels have no stdin (no human is attached). Pass values in the code instead.", what),
           call. = FALSE)
    }
  }

  # ---- main loop --------------------------------------------------------

  serve <- function(frame) {
    kind <- frame$type
    if (identical(kind, "execute")) {
      run_cell(frame)
    } else if (identical(kind, "inspect_variables")) {
      inspect(frame)
    } else if (identical(kind, "interrupt")) {
      # Only read between cells: the cell it was meant for has ended.
      rearm_sigint()
      send(list(type = "interrupt_ack", id = frame$id, running = FALSE,
                handler = sigint_handler(), raised = 0L))
    } else if (identical(kind, "shutdown")) {
      exit_now()
    }
  }

  # Fontconfig (under the PNG device) needs a writable cache directory; a
  # sandboxed kernel's home is not writable: then R's session temp dir.
  cache <- Sys.getenv("XDG_CACHE_HOME", file.path(Sys.getenv("HOME", "/nonexistent"), ".cache"))
  if (!nzchar(cache) || !isTRUE(file.access(if (dir.exists(cache)) cache else dirname(cache), 2L) == 0L)) {
    Sys.setenv(XDG_CACHE_HOME = file.path(tempdir(), "cache"))
  }
  config <- read_config()
  tool_names <- vapply(config$tools, as.character, "")
  register_api()
  replace_base("q", ends_cell)
  replace_base("quit", ends_cell)
  replace_base("readline", no_input("readline()"))
  replace_base("menu", no_input("menu()"),
               list(asNamespace("utils"), as.environment("package:utils")))
  options(device = open_device, warn = 0L)
  # IRdisplay (display_html(), display_png(), ...) publishes through this
  # option: its bundles become display frames.
  options(jupyter.base_display_func = function(data, metadata = NULL) {
    if (is.null(current) || !is.list(data) || length(data) == 0L) return(invisible(NULL))
    data <- lapply(data, function(v) if (is.raw(v)) gsub("[\r\n]", "", jsonlite::base64_enc(v)) else paste(as.character(v), collapse = "\n"))
    md <- if (is.list(metadata) && length(metadata) > 0L) metadata else structure(list(), names = character(0))
    send(list(type = "display", id = current, data = data, metadata = md))
    invisible(NULL)
  })
  send(list(type = "ready", pid = Sys.getpid(), python = R.version.string,
            executable = file.path(R.home("bin"), "R"), protocol = PROTOCOL))
  repeat {
    frame <- tryCatch(next_frame(), interrupt = function(i) FALSE)
    if (is.null(frame)) break
    if (isFALSE(frame)) next
    tryCatch(serve(frame), interrupt = function(i) NULL, error = function(e) {
      log_msg(paste("worker error:", conditionMessage(e)))
    })
  }
  # EOF: the host is gone.
  exit_now()
}, envir = new.env(parent = baseenv()))
