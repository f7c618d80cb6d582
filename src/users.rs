//! `rocketgate user …`: manages the user store file (`auth.users_file`, default
//! `<data_dir>/users.toml`) offline; a running node picks the change up within a
//! second (it watches the file). The first admin is made this way:
//! `rocketgate user add admin --role admin --password-stdin`.

use std::io::Read;

use anyhow::{Context, bail};
use rocketgate_auth::{AccessKey, UserEntry, UserFile, store};

use crate::cli::{AddArgs, UserCommand};

pub fn run(cmd: UserCommand) -> anyhow::Result<()> {
    match cmd {
        UserCommand::Add(a) => add(a),
        UserCommand::Remove { common, name } => {
            let path = common.load(Vec::new())?.users_file();
            let mut file = UserFile::load(&path)?;
            if !file.remove(&name) {
                bail!("no user {name:?} in {}", path.display());
            }
            file.save(&path)?;
            println!("removed user {name} from {}", path.display());
            Ok(())
        }
        UserCommand::List { common } => {
            let path = common.load(Vec::new())?.users_file();
            for u in UserFile::load(&path)?.users {
                println!(
                    "{}\troles={}\tpassword={}\tapi_keys={}\taccess_keys={}\trules={}",
                    u.name,
                    u.roles.join(","),
                    !u.password.is_empty(),
                    u.api_keys.len(),
                    u.access_keys
                        .iter()
                        .map(|a| a.access_key.as_str())
                        .collect::<Vec<_>>()
                        .join(","),
                    u.rules.len()
                );
            }
            Ok(())
        }
    }
}

fn add(a: AddArgs) -> anyhow::Result<()> {
    let config = a.common.load(Vec::new())?;
    let path = config.users_file();
    if a.name.is_empty() || a.name.contains(char::is_control) {
        bail!("a user name must be non-empty, without control characters");
    }
    let password = match (a.password, a.password_stdin) {
        (Some(p), _) => Some(p),
        (None, true) => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the password from standard input")?;
            let p = s.lines().next().unwrap_or("").to_owned();
            if p.is_empty() {
                bail!("an empty password on standard input");
            }
            Some(p)
        }
        (None, false) => None,
    };
    let mut file = UserFile::load(&path)?;
    let mut user = file
        .users
        .iter()
        .find(|u| u.name == a.name)
        .cloned()
        .unwrap_or_else(|| UserEntry {
            name: a.name.clone(),
            ..UserEntry::default()
        });
    if let Some(p) = password {
        store::set_password(&mut user, p.as_bytes());
    }
    if !a.roles.is_empty() {
        user.roles = a.roles;
    }
    let mut new_key = None;
    if a.api_key {
        let key = store::new_api_key();
        user.api_keys.push(store::hash_api_key(&key));
        new_key = Some(key);
    }
    if let (Some(ak), Some(sk)) = (a.access_key, a.secret_key) {
        user.access_keys.retain(|k| k.access_key != ak);
        user.access_keys.push(AccessKey {
            access_key: ak,
            secret_key: sk,
        });
    }
    if user.password.is_empty() && user.api_keys.is_empty() && user.access_keys.is_empty() {
        bail!(
            "user {} would have no credentials: give --password, --password-stdin, --api-key or --access-key/--secret-key",
            a.name
        );
    }
    file.upsert(user);
    file.save(&path)?;
    println!("user {} saved in {}", a.name, path.display());
    if let Some(k) = new_key {
        println!("api key (shown once): {k}");
    }
    if !config.auth.enabled {
        println!(
            "note: authentication is off; enable it with [auth] enabled = true (or ROCKETGATE_AUTH__ENABLED=true)"
        );
    }
    Ok(())
}
