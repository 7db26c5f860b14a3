//! A session: the named thing a caller talks to. It outlives its kernels;
//! each new kernel is a new *generation*.

use std::time::Duration;

use crate::config::KernelConfig;
use crate::error::KernelError;
use crate::kernel::{CellHandle, ExecOptions, InterruptOutcome, Kernel, Variables};
use crate::lineage::Lineage;
use crate::result::CellResult;

/// A session over successive kernels: the single-kernel case of the
/// sessions crate's `Registry`, on the same [`Lineage`] rules. After a
/// crash, an escalated interrupt or a restart, the next cell runs in a fresh
/// kernel (generation + 1) and its result says `state_reset: true` and why.
#[derive(Debug)]
pub struct Session {
    config: KernelConfig,
    lineage: Lineage,
}

impl Session {
    /// A session that starts its first kernel on first use.
    pub fn new(config: KernelConfig) -> Self {
        Session {
            lineage: Lineage::starting_at(config.generation),
            config,
        }
    }

    /// Session name.
    pub fn name(&self) -> &str {
        &self.config.session
    }

    /// The live generation (0 before the first kernel).
    pub fn generation(&self) -> u64 {
        self.lineage.generation()
    }

    /// The live kernel, if any.
    pub fn kernel(&self) -> Option<&Kernel> {
        self.lineage.live()
    }

    /// The live kernel, starting one (a new generation) if there is none.
    ///
    /// # Errors
    /// As [`Kernel::spawn`].
    pub async fn ensure_kernel(&mut self) -> Result<Kernel, KernelError> {
        if let Some(k) = self.lineage.live() {
            return Ok(k.clone());
        }
        self.lineage.forget_dead();
        let generation = self.lineage.next_generation();
        let mut cfg = self.config.clone();
        cfg.generation = generation;
        let k = Kernel::spawn(cfg).await?;
        self.lineage.install(k.clone(), generation);
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
        let generation = self.lineage.generation();
        let survived = self.lineage.held().is_some_and(Kernel::is_alive);
        self.lineage.settle(generation, survived, &mut r);
        Ok(r)
    }

    /// Interrupts the running cell of generation `generation` (or of the
    /// live one when `None`).
    ///
    /// # Errors
    /// [`KernelError::StaleGeneration`] when `generation` was replaced.
    pub async fn interrupt(&self, generation: Option<u64>) -> Result<InterruptOutcome, KernelError> {
        self.check_generation(generation)?;
        Ok(match self.lineage.held() {
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
        let replaced = self.lineage.generation();
        if let Some(k) = self.lineage.take() {
            k.kill().await;
        }
        self.lineage.note_reset(format!(
            "the session was restarted (generation {replaced} replaced)"
        ));
        self.ensure_kernel().await?;
        Ok(self.lineage.generation())
    }

    /// Kills the live kernel (the session can start another later).
    pub async fn shutdown(&mut self) {
        if let Some(k) = self.lineage.take() {
            k.kill().await;
        }
    }

    fn check_generation(&self, generation: Option<u64>) -> Result<(), KernelError> {
        match generation {
            Some(g) if g != self.lineage.generation() => Err(KernelError::StaleGeneration {
                session: self.config.session.clone(),
                requested: g,
                current: self.lineage.generation(),
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
