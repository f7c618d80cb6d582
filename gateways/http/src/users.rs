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
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::wire::{Json, Path};
use crate::{Ctx, consume};

/// Body of `PUT /v1/users/{name}`: what is given replaces what the user had;
/// API keys are kept (make them with `POST /v1/users/{name}/api_keys`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutUser {
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default)]
    pub roles: Option<Vec<String>>,
    #[serde(default)]
    pub rules: Option<Vec<Rule>>,
    #[serde(default)]
    pub access_keys: Option<Vec<AccessKey>>,
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
) -> Result<axum::Json<Value>> {
    auth_off(&ctx)?;
    let users = ctx.settings.auth.users();
    let list: Vec<Value> = users
        .file()
        .users
        .iter()
        .map(|u| {
            json!({
                "name": u.name,
                "password": !u.password.is_empty(),
                "roles": u.roles,
                "api_keys": u.api_keys.len(),
                "access_keys": u.access_keys.iter().map(|a| &a.access_key).collect::<Vec<_>>(),
                "rules": u.rules,
            })
        })
        .collect();
    Ok(axum::Json(json!({ "users": list })))
}

/// `PUT /v1/users/{name}`
pub async fn put<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(name): Path<String>,
    Json(body): Json<PutUser>,
) -> Result<axum::Json<Value>> {
    auth_off(&ctx)?;
    if name.is_empty() || name.contains(char::is_control) {
        return Err(Error::bad(
            "name",
            "must be non-empty, without control characters",
        ));
    }
    let auth = ctx.settings.auth.clone();
    let created = blocking(move || {
        let hash = body
            .password
            .as_deref()
            .map(|p| store::hash_password(p.as_bytes()));
        auth.update(|f| {
            let mut user = f.users.iter().find(|u| u.name == name).cloned();
            let created = user.is_none();
            let u = user.get_or_insert_with(|| UserEntry {
                name: name.clone(),
                ..UserEntry::default()
            });
            if let Some(h) = hash {
                u.password = h;
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
    Ok(axum::Json(json!({ "created": created })))
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
) -> Result<axum::Json<Value>> {
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
    Ok(axum::Json(json!({ "api_key": key })))
}

/// `POST /v1/users/reload`: read the user store file again.
pub async fn reload<B: MessagingApi + 'static>(State(ctx): State<Arc<Ctx<B>>>) -> Result<Response> {
    auth_off(&ctx)?;
    let auth = ctx.settings.auth.clone();
    blocking(move || auth.reload().map_err(store_error)).await?;
    Ok(consume::no_content())
}
