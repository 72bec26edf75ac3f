//! The end-to-end tests' Python scripts (`tests/python/`, real client libraries that `bash
//! .ci/run` installs): one way to run a script and read what it printed.

/// What a script printed, once it exited 0.
#[derive(Debug)]
pub struct Ran {
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    /// The last line of stdout, trimmed (the scripts print their report there).
    pub fn last_line(&self) -> &str {
        self.stdout.lines().last().unwrap_or_default().trim()
    }

    /// The last line of stdout as JSON.
    pub fn last_json(&self) -> serde_json::Value {
        serde_json::from_str(self.last_line())
            .unwrap_or_else(|e| panic!("the last line is not JSON ({e}):\n{}", self.stdout))
    }
}

/// Runs `python3 tests/python/NAME ARGS…` with `env` added; a script that fails to start or
/// exits non-zero is the error, with everything it printed.
pub fn script(name: &str, args: &[&str], env: &[(&str, &str)]) -> Result<Ran, String> {
    let path = format!("{}/python/{name}", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("python3")
        .args(["-W", "ignore::ResourceWarning", &path])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .map_err(|e| format!("python3 does not run ({e}); bash .ci/run installs it and the client libraries"))?;
    let ran = Ran {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    match out.status.success() {
        true => Ok(ran),
        false => Err(format!(
            "{name} {args:?} failed ({}):\n{}\n{}",
            out.status, ran.stderr, ran.stdout
        )),
    }
}
