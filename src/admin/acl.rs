//! `rocketgate admin acl list|add|remove`: the ACL rules of a running node's users
//! (docs/security.md, "ACL rules"), over the user API (`GET /v1/users`, `PUT
//! /v1/users/{name}` with `rules`). A change reads the user's rules, edits them and
//! writes them back: two operators editing one user's rules at the same moment can
//! lose one change (the user store has no compare-and-set), so edit one user from
//! one place at a time.

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::client::{Client, Failure, enc, exit};
use super::table;

#[derive(Debug, Subcommand)]
pub enum AclCmd {
    /// Every user's rules, numbered (the numbers `acl remove` takes).
    List {
        /// Only this user's.
        #[arg(value_name = "USER")]
        name: Option<String>,
    },
    /// Adds a rule to a user.
    Add(RuleArgs),
    /// Removes a user's rule by its number in `acl list`.
    Remove {
        #[arg(value_name = "USER")]
        name: String,
        index: usize,
    },
}

#[derive(Debug, Args)]
pub struct RuleArgs {
    /// The user (a positional `user` would clash with the global `--user`).
    #[arg(value_name = "USER")]
    pub name: String,
    /// `allow` or `deny`.
    #[arg(long, default_value = "allow", value_parser = ["allow", "deny"])]
    pub effect: String,
    /// Actions, comma-separated: publish, subscribe, admin, monitor, all.
    #[arg(long = "action", value_delimiter = ',', required = true,
          value_parser = ["publish", "subscribe", "admin", "monitor", "all"])]
    pub actions: Vec<String>,
    /// MQTT-style topic patterns (`orders/#`, `users/${username}/+`); repeatable.
    #[arg(long = "topic")]
    pub topics: Vec<String>,
    /// Consumer groups a subscribe rule applies to (`g`, `*`, `prefix*`); repeatable.
    #[arg(long = "group")]
    pub groups: Vec<String>,
}

pub async fn run(client: &Client, json: bool, cmd: AclCmd) -> Result<(), Failure> {
    match cmd {
        AclCmd::List { name: user } => {
            let v = client.get("/v1/users").await?;
            let users: Vec<&Value> = v["users"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|u| user.as_deref().is_none_or(|n| u["name"] == n))
                .collect();
            if let Some(n) = &user
                && users.is_empty()
            {
                return Err(no_user(n));
            }
            if json {
                let out: Vec<Value> = users
                    .iter()
                    .map(|u| json!({ "user": u["name"], "roles": u["roles"], "rules": u["rules"] }))
                    .collect();
                return print(&json!({ "users": out }));
            }
            let mut rows = Vec::new();
            for u in users {
                for (i, r) in u["rules"].as_array().into_iter().flatten().enumerate() {
                    rows.push(vec![
                        u["name"].as_str().unwrap_or_default().to_owned(),
                        i.to_string(),
                        r["effect"].as_str().unwrap_or_default().to_owned(),
                        list(&r["actions"]),
                        list(&r["topics"]),
                        list(&r["groups"]),
                    ]);
                }
            }
            table::print(
                &["USER", "#", "EFFECT", "ACTIONS", "TOPICS", "GROUPS"],
                rows,
            );
        }
        AclCmd::Add(a) => {
            let mut rules = rules_of(client, &a.name).await?;
            let mut rule = json!({ "effect": a.effect, "actions": a.actions });
            if !a.topics.is_empty() {
                rule["topics"] = json!(a.topics);
            }
            if !a.groups.is_empty() {
                rule["groups"] = json!(a.groups);
            }
            rules.push(rule);
            let index = rules.len() - 1;
            put_rules(client, &a.name, &rules).await?;
            if json {
                return print(&json!({ "user": a.name, "index": index, "rules": rules }));
            }
            println!("added rule {index} to {}", a.name);
        }
        AclCmd::Remove { name: user, index } => {
            let mut rules = rules_of(client, &user).await?;
            if index >= rules.len() {
                return Err(Failure {
                    code: exit::NOT_FOUND,
                    message: format!(
                        "user {user:?} has {} rule(s); no rule {index} (see `acl list {user}`)",
                        rules.len()
                    ),
                });
            }
            let removed = rules.remove(index);
            put_rules(client, &user, &rules).await?;
            if json {
                return print(&json!({ "user": user, "removed": removed, "rules": rules }));
            }
            println!("removed rule {index} of {user}");
        }
    }
    Ok(())
}

fn no_user(name: &str) -> Failure {
    Failure {
        code: exit::NOT_FOUND,
        message: format!("no user {name:?}"),
    }
}

async fn rules_of(client: &Client, user: &str) -> Result<Vec<Value>, Failure> {
    let v = client.get("/v1/users").await?;
    let u = v["users"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|u| u["name"] == user)
        .ok_or_else(|| no_user(user))?;
    Ok(u["rules"].as_array().cloned().unwrap_or_default())
}

async fn put_rules(client: &Client, user: &str, rules: &[Value]) -> Result<(), Failure> {
    client
        .put(
            &format!("/v1/users/{}", enc(user)),
            json!({ "rules": rules }),
        )
        .await?;
    Ok(())
}

fn list(v: &Value) -> String {
    let items: Vec<&str> = v
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if items.is_empty() {
        "-".into()
    } else {
        items.join(",")
    }
}

fn print(v: &Value) -> Result<(), Failure> {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
    Ok(())
}
