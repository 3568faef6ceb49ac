//! A context's bearer token from a command, as kubectl's exec credential
//! plugins give one: the command prints an `ExecCredential` (its
//! `status.token`) or the token alone.

use std::process::{Command, Stdio};

use crate::errors::CtlError;

/// What kubectl tells exec plugins (`KUBERNETES_EXEC_INFO`).
const EXEC_INFO: &str = r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"interactive":true}}"#;

/// Runs `argv` (its stderr and stdin the user's, for an interactive
/// login) and reads the token it prints.
pub fn token_from_command(argv: &[String]) -> Result<String, CtlError> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| CtlError::Message("the context's token_command is empty".into()))?;
    let out = Command::new(program)
        .args(args)
        .env("KUBERNETES_EXEC_INFO", EXEC_INFO)
        .stdin(Stdio::inherit())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| {
            CtlError::Message(format!("cannot run the context's token_command {program}: {e}"))
        })?;
    if !out.status.success() {
        return Err(CtlError::Message(format!(
            "the context's token_command {program} failed ({}); run it yourself to see why",
            out.status
        )));
    }
    parse(&String::from_utf8_lossy(&out.stdout))
        .map_err(|e| CtlError::Message(format!("the context's token_command {program}: {e}")))
}

/// The token in a command's output: an `ExecCredential`'s `status.token`,
/// or the whole output trimmed.
fn parse(output: &str) -> Result<String, String> {
    let output = output.trim();
    if output.starts_with('{') {
        let credential: serde_json::Value =
            serde_json::from_str(output).map_err(|e| format!("its output is not JSON: {e}"))?;
        if credential["kind"] != "ExecCredential" {
            return Err(format!(
                "printed a {} where an ExecCredential was expected",
                credential["kind"]
            ));
        }
        return credential["status"]["token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .ok_or_else(|| {
                "its ExecCredential has no status.token (client certificates are not taken)".into()
            });
    }
    if output.is_empty() || output.contains(char::is_whitespace) {
        return Err("it printed no token (one word, or an ExecCredential)".into());
    }
    Ok(output.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_exec_credential_or_a_bare_token() {
        let credential = r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"eyJ.a.b","expirationTimestamp":"2030-01-01T00:00:00Z"}}"#;
        assert_eq!(parse(credential).unwrap(), "eyJ.a.b");
        assert_eq!(parse("  eyJ.a.b\n").unwrap(), "eyJ.a.b");
        for bad in ["", "two words", "{}", r#"{"kind":"ExecCredential","status":{}}"#, "{nope"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
