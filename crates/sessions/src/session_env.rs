//! A session's own environment: variables and secrets given when the
//! session is created (the daemon's `exec --session --env/--secret-env`),
//! applied to each of its kernels on top of the registry's template.

/// Variables (name, value) and secret values of one session. Values never
/// appear in `Debug` output (only the names do), so a logged request or key
/// cannot echo a secret.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct SessionEnv {
    vars: Vec<(String, String)>,
    secrets: Vec<String>,
}

impl std::fmt::Debug for SessionEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionEnv")
            .field(
                "names",
                &self.vars.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            )
            .field("secrets", &self.secrets.len())
            .finish()
    }
}

impl SessionEnv {
    /// No variables, no secrets.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets variable `name` (a later value for the same name wins).
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        let name = name.into();
        self.vars.retain(|(k, _)| *k != name);
        self.vars.push((name, value.into()));
        self.vars.sort();
    }

    /// Sets variable `name` to a secret `value`, masked in everything the
    /// session's kernels output.
    pub fn set_secret(&mut self, name: impl Into<String>, value: impl Into<String>) {
        let value = value.into();
        self.set(name, value.clone());
        if !self.secrets.contains(&value) {
            self.secrets.push(value);
            self.secrets.sort();
        }
    }

    /// Nothing set.
    pub fn is_empty(&self) -> bool {
        self.vars.is_empty() && self.secrets.is_empty()
    }

    /// Every variable and secret of `other` is one of these.
    pub fn contains(&self, other: &SessionEnv) -> bool {
        other.vars.iter().all(|v| self.vars.contains(v))
            && other.secrets.iter().all(|s| self.secrets.contains(s))
    }

    /// The variables, sorted by name.
    pub fn vars(&self) -> &[(String, String)] {
        &self.vars
    }

    /// The secret values.
    pub fn secrets(&self) -> &[String] {
        &self.secrets
    }

    /// Applies the variables and secrets to a kernel's configuration.
    pub fn apply(&self, cfg: &mut cellhost_kernel::KernelConfig) {
        for (name, value) in &self.vars {
            cfg.env.retain(|(k, _)| k.to_str() != Some(name.as_str()));
            cfg.env.push((name.into(), value.into()));
        }
        for s in &self.secrets {
            cfg.register_secret(s.clone());
        }
    }
}

/// What [`crate::Registry::set_session_env`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvApplied {
    /// The session's kernels run with the requested environment (it was
    /// set now, or it was that already, or none was requested).
    Applied,
    /// The session already runs with another environment; it is kept (the
    /// request's applies to new sessions only).
    Kept,
}
