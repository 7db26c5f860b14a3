//! A session: the named thing a caller talks to. It outlives its kernels;
//! each new kernel is a new *generation*.

use std::time::Duration;

use crate::config::KernelConfig;
use crate::error::KernelError;
use crate::kernel::{CellHandle, ExecOptions, InterruptOutcome, Kernel, Variables};
use crate::result::CellResult;

/// A session over successive kernels. After a crash, an escalated interrupt
/// or a restart, the next cell runs in a fresh kernel (generation + 1) and
/// its result says `state_reset: true` and why.
#[derive(Debug)]
pub struct Session {
    config: KernelConfig,
    kernel: Option<Kernel>,
    generation: u64,
    pending_reset: Option<String>,
}

impl Session {
    /// A session that starts its first kernel on first use.
    pub fn new(config: KernelConfig) -> Self {
        Session {
            generation: config.generation.saturating_sub(1),
            config,
            kernel: None,
            pending_reset: None,
        }
    }

    /// Session name.
    pub fn name(&self) -> &str {
        &self.config.session
    }

    /// The live generation (0 before the first kernel).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The live kernel, if any.
    pub fn kernel(&self) -> Option<&Kernel> {
        self.kernel.as_ref().filter(|k| k.is_alive())
    }

    /// The live kernel, starting one (a new generation) if there is none.
    ///
    /// # Errors
    /// As [`Kernel::spawn`].
    pub async fn ensure_kernel(&mut self) -> Result<Kernel, KernelError> {
        if let Some(k) = &self.kernel {
            if k.is_alive() {
                return Ok(k.clone());
            }
            let why = k.exit_reason().unwrap_or_else(|| "the kernel died".into());
            self.pending_reset.get_or_insert(format!(
                "the previous kernel (generation {}) {why}",
                self.generation
            ));
            self.kernel = None;
        }
        self.generation += 1;
        let mut cfg = self.config.clone();
        cfg.generation = self.generation;
        let k = Kernel::spawn(cfg).await?;
        self.kernel = Some(k.clone());
        Ok(k)
    }

    /// Runs a cell, in a fresh kernel if the last one died.
    ///
    /// # Errors
    /// As [`Kernel::execute`].
    pub async fn execute(&mut self, code: &str, options: ExecOptions) -> Result<CellResult, KernelError> {
        let handle = self.submit(code, options).await?;
        self.finish(handle).await
    }

    /// Starts a cell without waiting.
    ///
    /// # Errors
    /// As [`Kernel::submit`].
    pub async fn submit(&mut self, code: &str, options: ExecOptions) -> Result<CellHandle, KernelError> {
        let k = self.ensure_kernel().await?;
        k.submit(code, options)
    }

    /// Waits for a submitted cell and marks a state reset on its result.
    ///
    /// # Errors
    /// As [`CellHandle::wait`].
    pub async fn finish(&mut self, handle: CellHandle) -> Result<CellResult, KernelError> {
        let mut r = handle.wait().await?;
        if let Some(why) = self.pending_reset.take() {
            r.kernel.state_reset = true;
            r.kernel.reset_reason = Some(why);
        }
        if let Some(k) = &self.kernel
            && !k.is_alive()
        {
            let why = match (&r.interrupt, &r.crash) {
                (Some(i), _) if i.escalated => format!(
                    "the previous kernel (generation {}) was killed during cell {}: {}",
                    self.generation,
                    r.cell_id,
                    i.reason
                        .as_deref()
                        .unwrap_or("an interrupt did not stop the cell")
                ),
                (_, Some(c)) => format!(
                    "the previous kernel (generation {}): {}",
                    self.generation, c.message
                ),
                _ => format!("the previous kernel (generation {}) died", self.generation),
            };
            self.pending_reset = Some(why);
        }
        Ok(r)
    }

    /// Interrupts the running cell of generation `generation` (or of the
    /// live one when `None`).
    ///
    /// # Errors
    /// [`KernelError::StaleGeneration`] when `generation` was replaced.
    pub async fn interrupt(&self, generation: Option<u64>) -> Result<InterruptOutcome, KernelError> {
        self.check_generation(generation)?;
        Ok(match &self.kernel {
            Some(k) => k.interrupt().await,
            None => InterruptOutcome {
                delivered: false,
                target: None,
                cell: None,
                reason: Some("no kernel".into()),
            },
        })
    }

    /// Lists variables of the live kernel.
    ///
    /// # Errors
    /// As [`Kernel::inspect_variables`]; [`KernelError::StaleGeneration`].
    pub async fn inspect_variables(
        &self,
        generation: Option<u64>,
        limit: u32,
    ) -> Result<Variables, KernelError> {
        self.check_generation(generation)?;
        match self.kernel() {
            Some(k) => k.inspect_variables(limit).await,
            None => Ok(Variables {
                variables: Vec::new(),
                truncated: false,
            }),
        }
    }

    /// Kills the live kernel and starts a fresh one (generation + 1).
    ///
    /// # Errors
    /// [`KernelError::StaleGeneration`]; spawn errors.
    pub async fn restart(&mut self, generation: Option<u64>) -> Result<u64, KernelError> {
        self.check_generation(generation)?;
        if let Some(k) = self.kernel.take() {
            k.kill().await;
        }
        self.pending_reset = Some(format!(
            "the session was restarted (generation {} replaced)",
            self.generation
        ));
        self.ensure_kernel().await?;
        Ok(self.generation)
    }

    /// Kills the live kernel (the session can start another later).
    pub async fn shutdown(&mut self) {
        if let Some(k) = self.kernel.take() {
            k.kill().await;
        }
    }

    fn check_generation(&self, generation: Option<u64>) -> Result<(), KernelError> {
        match generation {
            Some(g) if g != self.generation => Err(KernelError::StaleGeneration {
                session: self.config.session.clone(),
                requested: g,
                current: self.generation,
            }),
            _ => Ok(()),
        }
    }

    /// Sets the default per-cell timeout for kernels started from now on and
    /// for cells that do not give their own.
    pub fn set_cell_timeout(&mut self, timeout: Option<Duration>) {
        self.config.cell_timeout = timeout;
    }
}
