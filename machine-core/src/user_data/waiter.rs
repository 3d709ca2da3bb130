//! The completion waiter: a user-data part that reports cloud-init's verdict on the
//! whole user data, once every part of every layer has run.
//!
//! Why a waiter, rather than a last script: cloud-init's `scripts-user` runs every
//! script part sorted by file name and keeps going after one fails, so a "last" script
//! says nothing about the others, and runs before any part that sorts after it. cloud-init
//! itself writes [`VERDICT_RESULT_PATH`] once its final stage is over, holding the errors
//! of every stage (a failed script, `runcmd`, or module). The waiter part starts a small
//! detached Python process (cloud-init always brings Python 3) and returns at once; the
//! process survives the script (`cloud-final.service` has `KillMode=process`), waits for
//! that file and then reports: success only when cloud-init recorded no error, otherwise
//! cloud-init's own error lines. It does nothing else, so it cannot fail a bootstrap.
//!
//! The file exists only after the final stage of the current boot (cloud-init deletes
//! it when a boot begins), so a verdict never comes from an earlier boot. A machine
//! whose cloud-init never finishes gives no verdict; the composer's deadline covers it,
//! as it does a layer that reboots the machine at the end of the first boot
//! (`power_state`), which may stop the waiter before it reports.
//! The waiter gives up after [`CompletionWaiter::max_wait`] (default a day).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{UserDataFormat, UserDataPart};

/// Where cloud-init 22.4 (and every release since 0.7.7) writes the outcome of a boot
/// when its final stage ends: `{"v1": {"datasource": ..., "errors": [...]}}`.
pub const VERDICT_RESULT_PATH: &str = "/run/cloud-init/result.json";

/// A word on the waiter process's command line, so it can be found (`pgrep -f`).
pub const WAITER_MARKER: &str = "machine-core-completion-waiter";

/// The file name of the waiter's part (the assembly adds an index prefix).
const FILENAME: &str = "completion-waiter.sh";

/// Builds the waiter part: what it does with the verdict is set by
/// [`CompletionWaiter::files`] or [`CompletionWaiter::post`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletionWaiter {
    report: Report,
    max_wait: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Report {
    Files { success: String, failure: String },
    Post { url: String, tries: u32 },
}

impl CompletionWaiter {
    /// On success writes `success\n` to `success`; on failure writes cloud-init's error
    /// lines, one per line, to `failure`. Both are absolute paths; missing directories
    /// are created and each file appears whole (written beside, then renamed).
    pub fn files(success: impl Into<String>, failure: impl Into<String>) -> Self {
        CompletionWaiter {
            report: Report::Files {
                success: success.into(),
                failure: failure.into(),
            },
            max_wait: Duration::from_secs(24 * 3600),
        }
    }

    /// POSTs a form (`application/x-www-form-urlencoded`) to `url`, where
    /// `$INSTANCE_ID` is replaced by the machine's instance id, trying up to `tries`
    /// times with growing pauses (1, 2, 4 ... 30 s). The fields are `result` (`done` or
    /// `error`), `errors` (cloud-init's error lines, newline-separated), and as
    /// cloud-init's `phone_home` sends them: `instance_id`, `hostname`, `fqdn` and
    /// `pub_key_rsa` / `pub_key_ecdsa` / `pub_key_ed25519` for the host keys present.
    pub fn post(url: impl Into<String>, tries: u32) -> Self {
        CompletionWaiter {
            report: Report::Post {
                url: url.into(),
                tries: tries.max(1),
            },
            max_wait: Duration::from_secs(24 * 3600),
        }
    }

    /// Sets how long the waiter waits for cloud-init to finish before it gives up
    /// without a verdict.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The success file of the waiter a part's script starts, read back from the
    /// settings word [`CompletionWaiter::part`] writes; `None` for any other script or a
    /// waiter that posts. For a simulator standing in for the machine.
    pub fn success_file_in(script: &str) -> Option<String> {
        let line = script
            .lines()
            .find(|l| l.contains(WAITER_MARKER) && l.contains("-c"))?;
        let words = shlex::split(line)?;
        let at = words.iter().position(|w| w == WAITER_MARKER)?;
        #[derive(Deserialize)]
        struct Settings {
            report: Report,
        }
        let settings: Settings = serde_json::from_str(words.get(at + 1)?).ok()?;
        match settings.report {
            Report::Files { success, .. } => Some(success),
            Report::Post { .. } => None,
        }
    }

    /// The part: a shell script that starts the waiter in the background and exits 0.
    /// The settings travel as one shell-quoted JSON argument, so no path or URL can
    /// change the script.
    pub fn part(&self) -> UserDataPart {
        #[derive(Serialize)]
        struct Settings<'a> {
            report: &'a Report,
            result: &'a str,
            runcmd_layer: &'a str,
            max_wait_s: u64,
        }
        let settings = serde_json::to_string(&Settings {
            report: &self.report,
            result: VERDICT_RESULT_PATH,
            runcmd_layer: super::RUNCMD_LAYER_PATH,
            max_wait_s: self.max_wait.as_secs(),
        })
        .unwrap_or_default();
        let arg = shlex::try_quote(&settings).map_or_else(|_| "''".into(), |q| q.into_owned());
        let script = format!(
            "#!/bin/sh\n\
             # machine-core's completion waiter: reports cloud-init's verdict on every part\n\
             # once its final stage is over (see machine_core::user_data::CompletionWaiter).\n\
             py=$(command -v python3 || command -v /usr/libexec/platform-python) || {{\n\
             \x20 echo 'completion waiter: no python3 on this machine' >&2; exit 1; }}\n\
             code='{WAITER_PY}'\n\
             \"$py\" -c \"$code\" {WAITER_MARKER} {arg} </dev/null >/dev/null 2>&1 &\n"
        );
        UserDataPart::new(UserDataFormat::ShellScript, FILENAME, script)
    }
}

/// The waiter itself. It holds no single quote (it sits in a single-quoted shell word).
const WAITER_PY: &str = r#"
import json, os, socket, sys, time
cfg = json.loads(sys.argv[2])
try:
    os.setsid()
except OSError:
    pass
deadline = time.monotonic() + cfg["max_wait_s"]
while not os.path.exists(cfg["result"]):
    if time.monotonic() > deadline:
        sys.exit(0)
    time.sleep(0.2)
def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""

try:
    with open(cfg["result"]) as f:
        errors = [str(e) for e in json.load(f)["v1"]["errors"]]
except Exception as e:
    errors = ["cannot read " + cfg["result"] + ": " + repr(e)]
# cloud-init says only that runcmd failed; the composer marks whose command ran:
# "<index> <count> <layer>", index 0 when only the layer is known.
mark = read(cfg.get("runcmd_layer", ""))
if mark and any("runcmd" in e for e in errors):
    index, _, rest = mark.partition(" ")
    count, _, layer = rest.partition(" ")
    if index != "0":
        errors.append("runcmd of layer " + layer + " failed at its command " + index
                      + " of " + count + " (the first command to fail stops the list)")
    else:
        errors.append("runcmd of layer " + layer + " failed (the first of its " + count
                      + " commands to fail stopped the list)")
report = cfg["report"]

def write(path, text):
    os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)

if report["kind"] == "files":
    if errors:
        write(report["failure"], "".join(e + "\n" for e in errors))
    else:
        write(report["success"], "success\n")
else:
    import urllib.parse, urllib.request
    iid = read("/var/lib/cloud/data/instance-id") or socket.gethostname()
    fields = {"result": "error" if errors else "done", "errors": "\n".join(errors),
              "instance_id": iid, "hostname": socket.gethostname(), "fqdn": socket.getfqdn()}
    for algo in ("rsa", "ecdsa", "ed25519"):
        key = read("/etc/ssh/ssh_host_" + algo + "_key.pub")
        if key:
            fields["pub_key_" + algo] = key
    body = urllib.parse.urlencode(fields).encode()
    url = report["url"].replace("$INSTANCE_ID", urllib.parse.quote(iid, safe=""))
    for attempt in range(report["tries"]):
        try:
            req = urllib.request.Request(url, data=body, method="POST")
            urllib.request.urlopen(req, timeout=10).read()
            break
        except Exception:
            time.sleep(min(2 ** attempt, 30))
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_holds_settings_as_one_quoted_word() {
        let part = CompletionWaiter::files("/run/a b/'x'; rm -rf /", "/run/f").part();
        let text = String::from_utf8(part.content).unwrap();
        assert!(text.starts_with("#!/bin/sh\n"));
        assert!(!WAITER_PY.contains('\''), "the code sits in single quotes");
        let last = text.lines().last().unwrap();
        let words = shlex::split(last).unwrap();
        // "$py" -c "$code" MARKER SETTINGS < > 2>&1 &
        assert_eq!(words[3], WAITER_MARKER);
        let settings: serde_json::Value = serde_json::from_str(&words[4]).unwrap();
        assert_eq!(settings["report"]["success"], "/run/a b/'x'; rm -rf /");
        assert_eq!(settings["result"], VERDICT_RESULT_PATH);
    }
}
