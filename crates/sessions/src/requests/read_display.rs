//! `read_display`: the image file of one display of a cell the owner ran.

use super::{RequestError, validate_session};
use crate::cell_index::DisplayFile;
use crate::registry::Registry;

/// Open the image of display `id` (`<cell>.<n>` or `<cell>.result`, see
/// [`crate::cell_index::display_id`]) of a cell `owner` ran in `session`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadDisplayRequest {
    /// The owner.
    pub owner: String,
    /// The session.
    pub session: String,
    /// The display's id.
    pub id: String,
}

impl ReadDisplayRequest {
    /// The image's record and the file, opened only if it is still the
    /// regular, single-link file the host wrote at that path
    /// ([`cellhost_kernel::hostfs::open_verified`]).
    ///
    /// # Errors
    /// `bad_request` (name); `display_not_found` (no such image of this
    /// owner's session, or its file is gone or was replaced).
    pub fn execute(&self, reg: &Registry) -> Result<(DisplayFile, std::fs::File), RequestError> {
        validate_session(&self.session)?;
        let missing = || RequestError::DisplayNotFound { id: self.id.clone() };
        let d = reg
            .display_of(&self.owner, &self.session, &self.id)
            .ok_or_else(missing)?;
        let f = cellhost_kernel::hostfs::open_verified(&d.path).map_err(|_| missing())?;
        Ok((d, f))
    }
}
