//! The user store over HTTP (admin permission, see `access.rs`):
//! list, create or change, delete users, make API keys, reload the file. Changes
//! are written to the user store file and take effect at once on every door.
//! Secrets never come back: a password is hashed on the blocking pool, an API key
//! is shown once when made.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use rocketgate_auth::{AccessKey, Rule, UserEntry, store};
use rocketgate_core::broker::MessagingApi;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::wire::{Json, Path};
use crate::{Ctx, consume};

/// Body of `PUT /v1/users/{name}`: what is given replaces what the user had;
/// API keys are kept (make them with `POST /v1/users/{name}/api_keys`).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutUser {
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default)]
    pub roles: Option<Vec<String>>,
    /// ACL rules (`effect`, `actions`, `topics`, `groups`; docs/security.md).
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub rules: Option<Vec<Rule>>,
    /// RocketMQ AccessKey/SecretKey pairs (`access_key`, `secret_key`).
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub access_keys: Option<Vec<AccessKey>>,
}

/// A user as `GET /v1/users` shows it: no secrets.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct UserJson {
    pub name: String,
    /// Whether a password is set.
    pub password: bool,
    /// Whether the user has SCRAM-SHA-256 keys (MQTT enhanced authentication): a
    /// password set before SCRAM support has none until it is set again.
    pub scram: bool,
    pub roles: Vec<String>,
    /// How many API keys the user has.
    pub api_keys: usize,
    /// The access keys (without their secrets).
    pub access_keys: Vec<String>,
    /// ACL rules (docs/security.md).
    #[schema(value_type = Vec<Object>)]
    pub rules: Vec<Rule>,
}

/// `GET /v1/users`
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct UserList {
    pub users: Vec<UserJson>,
}

/// `PUT /v1/users/{name}`: whether the user was new.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UserPut {
    pub created: bool,
}

/// `POST /v1/users/{name}/api_keys`: the key, shown this once.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApiKey {
    pub api_key: String,
}

fn auth_off<B>(ctx: &Ctx<B>) -> Result<()> {
    if ctx.settings.auth.enabled() {
        Ok(())
    } else {
        Err(Error::bad(
            "auth",
            "authentication is off (auth.enabled = false): there is no user store",
        ))
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::bad("users", e.to_string()))?
}

fn store_error(e: rocketgate_auth::Error) -> Error {
    Error::bad("user store", e.to_string())
}

/// `GET /v1/users`
pub async fn list<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
) -> Result<axum::Json<UserList>> {
    auth_off(&ctx)?;
    let users = ctx.settings.auth.users();
    let users = users
        .file()
        .users
        .iter()
        .map(|u| UserJson {
            name: u.name.clone(),
            password: !u.password.is_empty(),
            scram: !u.scram_sha256.is_empty(),
            roles: u.roles.clone(),
            api_keys: u.api_keys.len(),
            access_keys: u.access_keys.iter().map(|a| a.access_key.clone()).collect(),
            rules: u.rules.clone(),
        })
        .collect();
    Ok(axum::Json(UserList { users }))
}

/// `PUT /v1/users/{name}`
pub async fn put<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(name): Path<String>,
    Json(body): Json<PutUser>,
) -> Result<axum::Json<UserPut>> {
    auth_off(&ctx)?;
    if name.is_empty() || name.contains(char::is_control) {
        return Err(Error::bad(
            "name",
            "must be non-empty, without control characters",
        ));
    }
    let auth = ctx.settings.auth.clone();
    let created = blocking(move || {
        // The argon2id hash and the SCRAM-SHA-256 keys (docs/security.md).
        let hash = body
            .password
            .as_deref()
            .map(|p| store::password_fields(p.as_bytes()));
        auth.update(|f| {
            let mut user = f.users.iter().find(|u| u.name == name).cloned();
            let created = user.is_none();
            let u = user.get_or_insert_with(|| UserEntry {
                name: name.clone(),
                ..UserEntry::default()
            });
            if let Some((h, scram)) = hash {
                u.password = h;
                u.scram_sha256 = scram;
            }
            if let Some(r) = body.roles {
                u.roles = r;
            }
            if let Some(r) = body.rules {
                u.rules = r;
            }
            if let Some(a) = body.access_keys {
                u.access_keys = a;
            }
            f.upsert(user.expect("set above"));
            created
        })
        .map_err(store_error)
    })
    .await?;
    Ok(axum::Json(UserPut { created }))
}

/// `DELETE /v1/users/{name}`
pub async fn delete<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(name): Path<String>,
) -> Result<Response> {
    auth_off(&ctx)?;
    let auth = ctx.settings.auth.clone();
    let shown = name.clone();
    let removed = blocking(move || auth.update(|f| f.remove(&name)).map_err(store_error)).await?;
    if !removed {
        return Err(Error::bad("name", format!("no user {shown:?}")));
    }
    Ok(consume::no_content())
}

/// `POST /v1/users/{name}/api_keys`: a new API key, shown this once.
pub async fn new_api_key<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(name): Path<String>,
) -> Result<axum::Json<ApiKey>> {
    auth_off(&ctx)?;
    let auth = ctx.settings.auth.clone();
    let key = store::new_api_key();
    let hashed = store::hash_api_key(&key);
    let shown = name.clone();
    let found = blocking(move || {
        auth.update(|f| match f.users.iter_mut().find(|u| u.name == name) {
            Some(u) => {
                u.api_keys.push(hashed);
                true
            }
            None => false,
        })
        .map_err(store_error)
    })
    .await?;
    if !found {
        return Err(Error::bad("name", format!("no user {shown:?}")));
    }
    Ok(axum::Json(ApiKey { api_key: key }))
}

/// `POST /v1/users/reload`: read the user store file again.
pub async fn reload<B: MessagingApi + 'static>(State(ctx): State<Arc<Ctx<B>>>) -> Result<Response> {
    auth_off(&ctx)?;
    let auth = ctx.settings.auth.clone();
    blocking(move || auth.reload().map_err(store_error)).await?;
    Ok(consume::no_content())
}
