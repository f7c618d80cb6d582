//! The packaging files (Dockerfile, .dockerignore, deploy/docker-compose.yml,
//! deploy/prometheus.yml, deploy/systemd/rocketgate.service) checked without a
//! container engine: every `ROCKETGATE_*` variable they set is a setting the
//! config accepts, every flag they pass is one the subcommand has (`--help`), the
//! paths and ports agree with each other, the health check they run answers on a
//! live node, and `Cargo.lock` is current (`cargo install --path . --locked`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use rocketgate_config::{Config, env_overrides};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rocketgate"))
}

/// The Dockerfile's instructions of the final stage, continuation lines joined.
fn dockerfile() -> Vec<(String, String)> {
    let text = read("Dockerfile").replace("\\\n", " ");
    let mut all: Vec<(String, String)> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let (i, rest) = l.split_once(char::is_whitespace)?;
            Some((i.to_ascii_uppercase(), rest.trim().to_owned()))
        })
        .collect();
    let last_from = all.iter().rposition(|(i, _)| i == "FROM").unwrap();
    all.drain(..last_from);
    all
}

/// `KEY=VALUE KEY2=VALUE2` of an ENV instruction.
fn env_pairs(s: &str) -> Vec<(String, String)> {
    s.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
        .collect()
}

/// A JSON-array instruction (`CMD ["a", "b"]`).
fn exec_form(s: &str) -> Vec<String> {
    let start = s.find('[').unwrap();
    serde_json::from_str(&s[start..]).unwrap()
}

/// The compose file as JSON (PyYAML: scripts/install-test-deps).
fn compose() -> Value {
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import sys, json, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(read("deploy/docker-compose.yml").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "PyYAML could not read the compose file"
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The settings these `ROCKETGATE_*` variables make load and validate.
fn load(env: &[(String, String)]) -> Config {
    let vars: Vec<(String, String)> = env
        .iter()
        .filter(|(k, _)| k.starts_with("ROCKETGATE_"))
        .cloned()
        .collect();
    Config::load(None, &env_overrides(vars))
        .unwrap_or_else(|e| panic!("the variables {env:?} are not valid settings: {e}"))
}

/// Every `--flag` of `args` (a `rocketgate …` command line) is in its
/// subcommand's `--help`.
fn flags_exist(args: &[String]) {
    let sub: Vec<&str> = args
        .iter()
        .take_while(|a| !a.starts_with('-'))
        .map(String::as_str)
        .collect();
    let help = bin().args(&sub).arg("--help").output().unwrap();
    assert!(help.status.success(), "rocketgate {sub:?} --help");
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in args.iter().filter(|a| a.starts_with("--")) {
        let flag = flag.split('=').next().unwrap();
        assert!(
            help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
            "rocketgate {sub:?} has no {flag}:\n{help}"
        );
    }
}

fn port(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .unwrap()
        .trim_matches('/')
        .parse()
        .unwrap()
}

#[test]
fn the_dockerfile_uses_real_settings_flags_paths_and_ports() {
    let d = dockerfile();
    let get = |i: &str| -> Vec<&str> {
        d.iter()
            .filter(|(x, _)| x == i)
            .map(|(_, a)| a.as_str())
            .collect()
    };
    let env: Vec<(String, String)> = get("ENV").iter().flat_map(|e| env_pairs(e)).collect();
    let config = load(&env);
    // The data directory is the volume, and the non-root user's home.
    assert_eq!(get("VOLUME"), ["/data"]);
    assert_eq!(config.data_dir, Path::new("/data"));
    assert_eq!(get("WORKDIR"), ["/data"]);
    let user = get("USER");
    assert_eq!(user.len(), 1);
    assert_ne!(user[0], "root");
    assert!(
        get("RUN")
            .iter()
            .any(|r| r.contains("useradd") && r.contains(user[0]))
    );
    // Every door listens beyond loopback, on a port that is exposed.
    let exposed: Vec<u16> = get("EXPOSE")
        .iter()
        .flat_map(|e| e.split_whitespace().map(|p| p.parse::<u16>().unwrap()))
        .collect();
    let l = &config.listen;
    for a in [l.namesrv, l.native, l.mqtt, l.http, l.ws, l.ha] {
        assert!(a.ip().is_unspecified(), "{a}");
        assert!(
            exposed.contains(&a.port()),
            "{a} is not exposed: {exposed:?}"
        );
    }
    // The entry point and command are real subcommands and flags.
    let mut cmd = exec_form(get("ENTRYPOINT")[0]);
    assert_eq!(cmd, ["rocketgate"]);
    cmd.extend(exec_form(get("CMD")[0]));
    flags_exist(&cmd[1..]);
    // The health check asks the HTTP door's port.
    let health = exec_form(get("HEALTHCHECK")[0]);
    assert_eq!(health[0], "rocketgate");
    flags_exist(&health[1..]);
    let server = &health[health.iter().position(|a| a == "--server").unwrap() + 1];
    assert_eq!(port(server), l.http.port());
    assert_eq!(health.last().unwrap(), "health");
    // The binary the run stage copies is the one the build stage made.
    let text = read("Dockerfile");
    assert!(
        text.contains("--locked"),
        "the image builds Cargo.lock's versions"
    );
    assert!(
        text.contains("COPY --from=builder /usr/local/bin/rocketgate /usr/local/bin/rocketgate")
    );
    // The build context leaves out build output and data.
    let ignore = read(".dockerignore");
    for p in ["target/", ".git/", "data/"] {
        assert!(ignore.lines().any(|l| l == p), ".dockerignore: {p}");
    }
}

#[test]
fn the_compose_cluster_uses_real_settings_flags_paths_and_ports() {
    let c = compose();
    let services = c["services"].as_object().unwrap();
    for name in ["namesrv", "master", "slave", "prometheus", "grafana"] {
        assert!(services.contains_key(name), "service {name}");
    }
    let image_env: Vec<(String, String)> = dockerfile()
        .iter()
        .filter(|(i, _)| i == "ENV")
        .flat_map(|(_, e)| env_pairs(e))
        .collect();
    let mut roles = BTreeMap::new();
    for name in ["namesrv", "master", "slave"] {
        let s = &services[name];
        assert_eq!(s["build"]["context"], "..");
        assert!(root().join("Dockerfile").exists());
        let args: Vec<String> = s["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        flags_exist(&args);
        // The image's variables, then the service's.
        let mut env = image_env.clone();
        for (k, v) in s["environment"].as_object().into_iter().flatten() {
            env.push((k.clone(), v.as_str().unwrap().to_owned()));
        }
        let config = load(&env);
        let flag = |f: &str| {
            args.iter()
                .position(|a| a == f)
                .map(|i| args[i + 1].clone())
        };
        if name != "namesrv" {
            // Brokers register with the NameServer service, keep data on a volume.
            let ns = flag("--namesrv").unwrap();
            assert_eq!(ns.split(':').next().unwrap(), "namesrv");
            assert_eq!(port(&ns), config.listen.namesrv.port());
            let vols = s["volumes"].as_array().unwrap();
            assert!(vols.iter().any(|v| v.as_str().unwrap().ends_with(":/data")));
            assert!(
                !config.ha.secret.is_empty(),
                "{name}: replication needs ha.secret"
            );
            roles.insert(name, flag("--broker-id").unwrap());
            // What the NameServer hands native clients is a published port of the
            // container's native door, not the 0.0.0.0 it listens on.
            let adv = config.advertised_native();
            assert!(!adv.starts_with("0.0.0.0"), "{name} advertises {adv}");
            let mapping = format!("{}:{}", port(&adv), config.listen.native.port());
            assert!(
                s["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p.as_str().unwrap().ends_with(&mapping)),
                "{name} advertises {adv} but does not publish {mapping}"
            );
        }
        if name == "slave" {
            let m = flag("--ha-master").unwrap();
            assert_eq!(m.split(':').next().unwrap(), "master");
            assert_eq!(port(&m), port(&flag_of(services, "master", "--ha")));
        }
        // Published ports are ports the container listens on.
        for p in s["ports"].as_array().into_iter().flatten() {
            let inner: u16 = p
                .as_str()
                .unwrap()
                .rsplit(':')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            let l = &config.listen;
            assert!(
                [l.namesrv, l.native, l.mqtt, l.http, l.ws, l.ha]
                    .iter()
                    .any(|a| a.port() == inner),
                "{name} publishes {inner}, which nothing listens on"
            );
        }
    }
    assert_eq!(roles["master"], "0");
    assert_ne!(roles["slave"], "0");
    // Prometheus scrapes both brokers' HTTP doors; its config and Grafana's
    // provisioning are files next to the compose file.
    let prom_mount = services["prometheus"]["volumes"][0].as_str().unwrap();
    let prom_file = prom_mount.split(':').next().unwrap();
    let prom = read(&format!("deploy/{prom_file}"));
    let http_port = load(&image_env).listen.http.port();
    for target in ["master", "slave"] {
        assert!(prom.contains(&format!("{target}:{http_port}")), "{prom}");
    }
    assert!(prom.contains("metrics_path: /metrics"));
    let grafana = services["grafana"]["volumes"][0].as_str().unwrap();
    let dir = grafana.split(':').next().unwrap();
    assert!(root().join("deploy").join(dir).is_dir(), "{dir}");
}

fn flag_of(services: &serde_json::Map<String, Value>, service: &str, f: &str) -> String {
    let args = services[service]["command"].as_array().unwrap();
    let i = args.iter().position(|a| a == f).unwrap();
    args[i + 1].as_str().unwrap().to_owned()
}

#[test]
fn the_systemd_unit_uses_real_flags_and_consistent_paths() {
    let unit = read("deploy/systemd/rocketgate.service");
    let value = |k: &str| -> String {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k}="))
            .to_owned()
    };
    let exec: Vec<String> = value("ExecStart")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(exec[0], "/usr/local/bin/rocketgate");
    flags_exist(&exec[1..]);
    let data = &exec[exec.iter().position(|a| a == "--data-dir").unwrap() + 1];
    assert_eq!(*data, format!("/var/lib/{}", value("StateDirectory")));
    assert_eq!(*data, value("WorkingDirectory"));
    assert!(value("ReadWritePaths").contains(data.as_str()));
    assert_ne!(value("User"), "root");
    assert_eq!(value("KillSignal"), "SIGTERM");
    // The codes a restart does not fix are the binary's (src/main.rs).
    let main = read("src/main.rs");
    for code in value("RestartPreventExitStatus").split_whitespace() {
        assert!(
            main.contains(&format!(": u8 = {code};")),
            "exit code {code}"
        );
    }
    // The example config it installs is valid.
    Config::load(Some(&root().join("rocketgate.example.toml")), &[]).unwrap();
}

/// The node, killed when the test ends (also on a panic).
struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_health_check_the_image_runs_answers_on_a_live_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = bin()
        .env("ROCKETGATE_STORE__DISK_HARD_RATIO", "1")
        .args(["standalone", "--data-dir"])
        .arg(dir.path())
        .args([
            "--namesrv",
            "0",
            "--native",
            "0",
            "--mqtt",
            "0",
            "--http",
            "0",
            "--ws",
            "0",
        ])
        .env("ROCKETGATE_STORE__SEGMENT_SIZE", "1MiB")
        .env("ROCKETGATE_STORE__MAX_MESSAGE_SIZE", "64KiB")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut http = String::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(a) = line.strip_prefix("rocketgate: http listening on ") {
            http = a.to_owned();
        }
        if line.contains("standalone ready") {
            break;
        }
    }
    let _node = Node(child);
    let d = dockerfile();
    let (_, hc) = d.iter().find(|(i, _)| i == "HEALTHCHECK").unwrap();
    let mut args = exec_form(hc);
    let s = args.iter().position(|a| a == "--server").unwrap() + 1;
    args[s] = format!("http://{http}");
    // Ready once the first registration with the NameServer was taken (as the
    // image's start period allows).
    let started = std::time::Instant::now();
    let out = loop {
        let out = bin().args(&args[1..]).output().unwrap();
        if out.status.success() || started.elapsed() > std::time::Duration::from_secs(10) {
            break out;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // And nothing listening: unhealthy (exit 3, unreachable).
    args[s] = "http://127.0.0.1:1".into();
    let out = bin().args(&args[1..]).output().unwrap();
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn cargo_lock_is_current_for_cargo_install_locked() {
    // `cargo install --path . --locked` fails when Cargo.lock needs a change; this
    // resolves the same way without building.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Only this machine's platform: the packages of others (Android, Windows, …) are
    // never downloaded here, and `--offline` must not need them.
    let platform = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let out = Command::new(cargo)
        .args(["metadata", "--locked", "--offline", "--format-version", "1"])
        .args(["--filter-platform", &platform])
        .current_dir(root())
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
