//! The worker's environment, built by allowlist.
//!
//! Only names known to be safe pass from the host's environment; names that
//! look secret never pass unless the configuration names them explicitly,
//! and their values are returned so the redactor can mask them.

use std::ffi::OsString;

/// Exact names that pass.
pub const ALLOWED_NAMES: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TERM",
    "TMPDIR",
    "SHELL",
    "MPLBACKEND",
    "MPLCONFIGDIR",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "CUDA_VISIBLE_DEVICES",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "PYTHONIOENCODING",
    "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUTF8",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NO_COLOR",
];

/// Where a remote kernel runs, as its scheduler tells it (a kernel placed
/// by Slurm or Kubernetes sees its job or pod). Exact names, not a `SLURM_`
/// prefix: Slurm also sets names that carry authentication (`SLURM_JWT`).
/// The Kubernetes names are set by the Pod template's downward API.
pub const SCHEDULER_NAMES: &[&str] = &[
    "SLURM_JOB_ID",
    "SLURM_JOBID",
    "SLURM_JOB_NAME",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "SLURM_JOB_NUM_NODES",
    "SLURM_NNODES",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_ACCOUNT",
    "SLURM_JOB_QOS",
    "SLURM_CLUSTER_NAME",
    "SLURM_JOB_CPUS_PER_NODE",
    "SLURM_CPUS_ON_NODE",
    "SLURM_CPUS_PER_TASK",
    "SLURM_MEM_PER_NODE",
    "SLURM_MEM_PER_CPU",
    "SLURM_NTASKS",
    "SLURM_NODEID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_TASKS_PER_NODE",
    "SLURM_SUBMIT_HOST",
    "SLURM_SUBMIT_DIR",
    "SLURMD_NODENAME",
    "SLURM_GPUS",
    "SLURM_GPUS_ON_NODE",
    "SLURM_JOB_GPUS",
    "SLURM_STEP_GPUS",
    "GPU_DEVICE_ORDINAL",
    "CELLHOST_POD_NAME",
    "CELLHOST_POD_NAMESPACE",
    "CELLHOST_NODE_NAME",
];

/// Name prefixes that pass.
pub const ALLOWED_PREFIXES: &[&str] = &["LC_"];

/// Substrings that mark a name as secret (checked case-insensitively).
pub const SECRET_MARKERS: &[&str] = &[
    "KEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "AUTH",
    "COOKIE",
    "SESSION",
];

/// Names that never pass unless named explicitly: they change what code the
/// interpreter or the dynamic loader runs.
pub fn is_dangerous(name: &str) -> bool {
    name.starts_with("LD_")
        || name.starts_with("DYLD_")
        || matches!(
            name,
            "PYTHONSTARTUP" | "PYTHONHOME" | "PYTHONPATH" | "BASH_ENV" | "ENV"
        )
}

/// The name looks like it holds a secret.
pub fn looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_MARKERS.iter().any(|m| upper.contains(m))
}

/// Result of filtering an environment.
#[derive(Debug, Default, Clone)]
pub struct FilteredEnv {
    /// Variables that pass, in input order.
    pub pass: Vec<(OsString, OsString)>,
    /// Values withheld because their names look secret (for the redactor).
    pub withheld_secret_values: Vec<String>,
    /// Names withheld (for diagnostics; values are not kept).
    pub withheld_names: Vec<String>,
}

/// Filters `vars` by the allowlist. `explicit` names always pass.
pub fn filter_env<I>(vars: I, explicit: &[String]) -> FilteredEnv
where
    I: IntoIterator<Item = (OsString, OsString)>,
{
    let mut out = FilteredEnv::default();
    for (k, v) in vars {
        let name = k.to_string_lossy().into_owned();
        if explicit.iter().any(|e| e == &name) {
            out.pass.push((k, v));
            continue;
        }
        let secret = looks_secret(&name);
        let allowed = !secret
            && !is_dangerous(&name)
            && (ALLOWED_NAMES.contains(&name.as_str())
                || SCHEDULER_NAMES.contains(&name.as_str())
                || ALLOWED_PREFIXES.iter().any(|p| name.starts_with(p)));
        if allowed {
            out.pass.push((k, v));
        } else {
            if secret {
                out.withheld_secret_values.push(v.to_string_lossy().into_owned());
            }
            out.withheld_names.push(name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(a: &str, b: &str) -> (OsString, OsString) {
        (a.into(), b.into())
    }

    #[test]
    fn allowlist_passes_safe_names_and_withholds_secrets() {
        let f = filter_env(
            vec![
                os("PATH", "/bin"),
                os("LC_ALL", "C"),
                os("OPENAI_API_KEY", "sk-xyz"),
                os("GITHUB_TOKEN", "ghp_abc"),
                os("LD_PRELOAD", "/evil.so"),
                os("RANDOM_THING", "x"),
                os("MY_PASSWORD", "hunter22"),
            ],
            &["RANDOM_THING".to_string()],
        );
        let names: Vec<_> = f
            .pass
            .iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["PATH", "LC_ALL", "RANDOM_THING"]);
        assert_eq!(f.withheld_secret_values, ["sk-xyz", "ghp_abc", "hunter22"]);
        assert!(f.withheld_names.contains(&"LD_PRELOAD".to_string()));
    }

    #[test]
    fn scheduler_job_variables_pass_but_slurms_jwt_does_not() {
        let f = filter_env(
            vec![
                os("SLURM_JOB_ID", "42"),
                os("SLURM_JOB_NODELIST", "node[1-2]"),
                os("CELLHOST_POD_NAME", "cellhost-ab"),
                os("SLURM_JWT", "eyJ..."),
                os("SLURM_CONF", "/etc/slurm/slurm.conf"),
            ],
            &[],
        );
        let names: Vec<_> = f
            .pass
            .iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["SLURM_JOB_ID", "SLURM_JOB_NODELIST", "CELLHOST_POD_NAME"]);
        assert!(f.withheld_names.contains(&"SLURM_JWT".to_string()));
    }

    #[test]
    fn explicit_names_pass_even_when_secret_looking() {
        let f = filter_env(vec![os("DEMO_TOKEN", "v")], &["DEMO_TOKEN".to_string()]);
        assert_eq!(f.pass.len(), 1);
        assert!(f.withheld_secret_values.is_empty());
    }
}
