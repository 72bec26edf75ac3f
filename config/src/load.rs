//! Loading a `Config`: the env file found and read, the layers stacked (command line, process
//! environment, env file, demo, profile defaults), then every knob resolved and built.

use std::path::{Path, PathBuf};

use crate::build;
use crate::config::{Config, LoadOptions};
use crate::dotenv::DotEnv;
use crate::error::ConfigError;
use crate::resolve::Layers;

impl Config {
    /// Loads, layers and validates. Every invalid value is reported, not just the first.
    pub fn load(options: &LoadOptions) -> Result<Config, ConfigError> {
        Self::load_in(options, None)
    }

    /// Loads with one group's section of GROUPS_FILE as the highest layer.
    pub(crate) fn load_in(options: &LoadOptions, group: Option<&DotEnv>) -> Result<Config, ConfigError> {
        let env_file = match &options.env_file {
            Some(path) => Some(absolute(&options.working_dir, path)),
            None => Some(options.working_dir.join(".env")).filter(|p| p.is_file()),
        };
        let process = |name: &str| options.process_env.get(name).cloned();
        let dotenv = env_file.as_deref().map(|p| DotEnv::read(p, &process)).transpose()?;
        let deploy_dir = env_file
            .as_deref()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_else(|| options.working_dir.clone());
        let mut command_line = options.overrides.clone();
        if let Some(profile) = &options.profile {
            command_line.insert("PROFILE".to_owned(), profile.clone());
        }
        let layers = Layers {
            group,
            command_line: &command_line,
            process: &options.process_env,
            dotenv: dotenv.as_ref(),
            demo: &options.demo,
            deploy_dir: deploy_dir.display().to_string(),
        };
        build::build(layers, env_file)
    }
}

fn absolute(base: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    }
}
