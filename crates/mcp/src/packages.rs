//! `install_packages`: an adapter over the request layer's
//! [`InstallRequest`] — the host installs packages into the session's
//! overlay (the kernel stays offline) and the next `execute_code` imports
//! them.

use cellhost_sessions::Origin;
use cellhost_sessions::requests::InstallRequest;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, schemars, tool, tool_router};
use serde::Deserialize;
use serde_json::json;

use crate::{CellhostMcp, request_tool_error, session_name, text_result};

/// Parameters of `install_packages`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct InstallPackagesParams {
    /// Requirement specs: `name`, `name[extra]`, `name>=1.0,<2` (no
    /// options, environment markers, paths or URLs).
    pub packages: Vec<String>,
    /// Session name (default "default").
    #[serde(default)]
    pub session: Option<String>,
}

#[tool_router(router = packages_router, vis = "pub(crate)")]
impl CellhostMcp {
    #[tool(
        description = "Install Python packages into a session; the next execute_code call imports \
them without a restart. The host runs the installer (wheels from the configured package index) \
outside the sandbox; code in the session stays offline (its own pip cannot reach the network, so \
use this tool, or `%pip install NAME` in a cell, which does the same). `packages` are requirement \
specs such as `tomli`, `requests[socks]`, `pandas>=2,<3`; options, paths and URLs are refused \
(error code invalid_package_spec). The result lists what was added and says `restart_needed` \
when a module it replaced was already imported (restart the session to use the new version). \
An installer failure is error code install_failed with the tail of the installer's stderr."
    )]
    async fn install_packages(
        &self,
        Parameters(p): Parameters<InstallPackagesParams>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = session_name(p.session)?;
        let req = InstallRequest::new(self.spec(&session), p.packages, Origin::new("mcp"));
        match req.execute(&self.inner.registry).await {
            Ok(done) => {
                let r = &done.report;
                let mut text = if r.installed.is_empty() {
                    format!("nothing new to install in session \"{session}\" (already satisfied)")
                } else {
                    format!(
                        "installed in session \"{session}\": {}",
                        r.installed
                            .iter()
                            .map(|d| format!("{} {}", d.name, d.version))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                if r.restart_needed {
                    text.push_str(&format!(
                        "\nrestart needed: {} already imported (call restart, then import again)",
                        r.restart_modules.join(", ")
                    ));
                }
                Ok(text_result(text, json!(done.report)))
            }
            Err(e) => Ok(request_tool_error("install_packages failed", &e)),
        }
    }
}
