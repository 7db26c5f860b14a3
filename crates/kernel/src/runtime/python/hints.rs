//! Hints for Python's errors.

use std::path::Path;

use crate::result::{CellError, CellResult};

/// Import names whose distribution on PyPI is named differently (the
/// common ones; a name not listed is its own distribution's).
const DISTRIBUTIONS: &[(&str, &str)] = &[
    ("sklearn", "scikit-learn"),
    ("skimage", "scikit-image"),
    ("cv2", "opencv-python"),
    ("yaml", "PyYAML"),
    ("bs4", "beautifulsoup4"),
    ("PIL", "Pillow"),
    ("dateutil", "python-dateutil"),
    ("dotenv", "python-dotenv"),
    ("jwt", "PyJWT"),
    ("Crypto", "pycryptodome"),
    ("OpenSSL", "pyOpenSSL"),
    ("serial", "pyserial"),
    ("usb", "pyusb"),
    ("magic", "python-magic"),
    ("docx", "python-docx"),
    ("pptx", "python-pptx"),
    ("fitz", "PyMuPDF"),
    ("git", "GitPython"),
    ("attr", "attrs"),
    ("MySQLdb", "mysqlclient"),
    ("psycopg2", "psycopg2-binary"),
    ("zmq", "pyzmq"),
    ("Bio", "biopython"),
    ("sentencepiece", "sentencepiece"),
    ("tensorflow_datasets", "tensorflow-datasets"),
    ("torchvision", "torchvision"),
    ("mpl_toolkits", "matplotlib"),
    ("pkg_resources", "setuptools"),
    ("win32api", "pywin32"),
    ("gi", "PyGObject"),
    ("wx", "wxPython"),
    ("lxml", "lxml"),
    ("umap", "umap-learn"),
    ("community", "python-louvain"),
    ("slugify", "python-slugify"),
    ("multipart", "python-multipart"),
    ("jose", "python-jose"),
    ("socks", "PySocks"),
    ("tables", "tables"),
    ("Levenshtein", "python-Levenshtein"),
    ("ruamel", "ruamel.yaml"),
    ("geopandas", "geopandas"),
    ("osgeo", "GDAL"),
    ("IPython", "ipython"),
];

/// The distribution to install for import name `top`, when it differs.
pub(super) fn distribution_of(top: &str) -> Option<&'static str> {
    DISTRIBUTIONS.iter().find(|(m, _)| *m == top).map(|(_, d)| *d)
}

/// The hint for `e`, the error of `r`, if one applies.
pub(super) fn error_hint(e: &CellError, r: &CellResult, python: &Path) -> Option<String> {
    match e.ename.as_str() {
        "ModuleNotFoundError" => {
            let module = e.evalue.split('\'').nth(1).unwrap_or("the module");
            let top = module.split('.').next().unwrap_or(module);
            let dist = distribution_of(top).unwrap_or(top);
            Some(format!(
                "'{module}' is not installed in the kernel's interpreter {}; install it there (e.g. `{} -m pip install {dist}`) or use another --python.",
                python.display(),
                python.display()
            ))
        }
        "FileNotFoundError" => {
            let cwd = r.cwd.as_deref().unwrap_or("(deleted)");
            Some(format!(
                "Relative paths resolve against the kernel's current directory {cwd}; check the path or use an absolute one."
            ))
        }
        "ToolError" if e.evalue.contains("budget") => {
            Some("This cell spent its host-call budget; split the work across cells.".into())
        }
        "ToolError" if e.evalue.contains("not enabled") => {
            Some("That tool is not enabled for this session; list tools with `dir(cellhost.tools)`.".into())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_names_map_to_distributions() {
        assert_eq!(distribution_of("sklearn"), Some("scikit-learn"));
        assert_eq!(distribution_of("cv2"), Some("opencv-python"));
        assert_eq!(distribution_of("yaml"), Some("PyYAML"));
        assert_eq!(distribution_of("bs4"), Some("beautifulsoup4"));
        assert_eq!(distribution_of("PIL"), Some("Pillow"));
        assert_eq!(distribution_of("numpy"), None);
    }
}
