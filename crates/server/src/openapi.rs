//! The OpenAPI 3.1 description of `/v1`, written by hand so it says what the handlers do.

use serde_json::{json, Value};

fn error_responses(codes: &[&str]) -> Value {
    let mut out = serde_json::Map::new();
    for code in codes {
        let description = match *code {
            "400" => "Malformed JSON or parameters",
            "401" => "Missing or wrong API key",
            "404" => "Unknown sandbox, process or file",
            "409" => "Conflict: sandbox not running, file exists, not a directory",
            "422" => "Limits out of range or invalid spec",
            "502" => "The sandbox agent failed",
            "507" => "No space left in the sandbox",
            _ => "Error",
        };
        out.insert(code.to_string(), json!({ "description": description, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }));
    }
    Value::Object(out)
}

fn with_errors(mut responses: Value, codes: &[&str]) -> Value {
    if let (Some(map), Value::Object(errors)) = (responses.as_object_mut(), error_responses(codes)) {
        map.extend(errors);
    }
    responses
}

fn json_body(schema: &str) -> Value {
    json!({ "required": true, "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } } })
}

fn json_response(description: &str, schema: Value) -> Value {
    json!({ "description": description, "content": { "application/json": { "schema": schema } } })
}

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn param(name: &str, location: &str, required: bool, schema: Value, description: &str) -> Value {
    json!({ "name": name, "in": location, "required": required, "schema": schema, "description": description })
}

fn id_param() -> Value {
    param("id", "path", true, json!({ "type": "string" }), "Sandbox id")
}

fn pid_param() -> Value {
    param("pid", "path", true, json!({ "type": "integer", "minimum": 0 }), "Process id inside the sandbox")
}

fn path_query() -> Value {
    param("path", "query", true, json!({ "type": "string" }), "Absolute path inside the sandbox")
}

fn user_query() -> Value {
    param("user", "query", false, json!({ "type": "string" }), "\"user\" (default), \"root\" or a numeric uid")
}

fn event_stream(description: &str) -> Value {
    json!({
        "description": description,
        "content": {
            "application/x-ndjson": { "schema": schema_ref("OutputEvent") },
            "text/event-stream": { "schema": { "type": "string", "description": "SSE: `event: <type>` and `data: <OutputEvent JSON>`" } }
        }
    })
}

fn no_content(description: &str) -> Value {
    json!({ "description": description })
}

pub fn document() -> Value {
    let mut doc = base_document();
    if let (Some(paths), Value::Object(more)) = (doc["paths"].as_object_mut(), state_paths()) {
        paths.extend(more);
    }
    if let (Some(schemas), Value::Object(more)) = (doc["components"]["schemas"].as_object_mut(), state_schemas()) {
        schemas.extend(more);
    }
    doc
}

/// Pause/resume, snapshots, rollback and fork.
fn state_paths() -> Value {
    let snap_param = param("id", "path", true, json!({ "type": "string" }), "Snapshot id");
    json!({
        "/v1/sandboxes/{id}/pause": { "parameters": [id_param()], "post": {
            "summary": "Freeze every process: no CPU, memory and processes kept, timeout stopped",
            "responses": with_errors(json!({ "200": json_response("The paused sandbox", schema_ref("SandboxInfo")) }), &["401", "404", "409"]) } },
        "/v1/sandboxes/{id}/resume": { "parameters": [id_param()], "post": {
            "summary": "Thaw a paused sandbox; its timeout runs again with the time it had left",
            "responses": with_errors(json!({ "200": json_response("The running sandbox", schema_ref("SandboxInfo")) }), &["401", "404", "409"]) } },
        "/v1/sandboxes/{id}/snapshots": { "parameters": [id_param()],
            "post": {
                "summary": "Snapshot the writable layer, settings and interpreter variables (processes are held frozen meanwhile; their memory is not captured)",
                "requestBody": { "required": false, "content": { "application/json": { "schema": { "type": "object", "properties": { "name": { "type": "string" } } } } } },
                "responses": with_errors(json!({ "201": json_response("The snapshot", schema_ref("Snapshot")) }), &["401", "404", "409", "502", "507"]) },
            "get": { "summary": "This sandbox's snapshots", "responses": with_errors(json!({ "200": json_response("Snapshots, newest first", json!({ "type": "object", "properties": { "snapshots": { "type": "array", "items": schema_ref("Snapshot") } } })) }), &["401", "404"]) } },
        "/v1/sandboxes/{id}/restore": { "parameters": [id_param()], "post": {
            "summary": "Roll the sandbox back to a snapshot in place (same id and settings; its processes restart)",
            "requestBody": { "required": true, "content": { "application/json": { "schema": { "type": "object", "required": ["snapshot"], "properties": { "snapshot": { "type": "string" } } } } } },
            "responses": with_errors(json!({ "200": json_response("The sandbox", schema_ref("SandboxInfo")) }), &["401", "404", "409", "422", "507"]) } },
        "/v1/sandboxes/{id}/fork": { "parameters": [id_param()], "post": {
            "summary": "Snapshot the sandbox and create `count` sandboxes from it",
            "requestBody": { "required": false, "content": { "application/json": { "schema": { "type": "object", "properties": {
                "count": { "type": "integer", "minimum": 1, "maximum": 64, "default": 1 }, "timeout": { "type": "integer" },
                "metadata": { "type": "object", "additionalProperties": { "type": "string" } } } } } } },
            "responses": with_errors(json!({ "201": json_response("The snapshot id and the new sandboxes", json!({ "type": "object", "properties": {
                "snapshot": { "type": "string" }, "sandboxes": { "type": "array", "items": schema_ref("SandboxInfo") } } })) }), &["401", "404", "409", "422"]) } },
        "/v1/pools": { "get": {
            "summary": "Warm pools: configuration, sizes, hits, misses, refill latency",
            "responses": with_errors(json!({ "200": json_response("Every pool", json!({ "type": "object", "properties": { "pools": { "type": "array", "items": schema_ref("Pool") } } })) }), &["401"]) } },
        "/v1/pools/{template}": { "parameters": [param("template", "path", true, json!({ "type": "string" }), "Template name")],
            "put": {
                "summary": "Create or change the template's pool (stored; survives restarts)",
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "type": "object", "required": ["min"], "properties": {
                    "min": { "type": "integer", "minimum": 0, "description": "Always kept ready" },
                    "max": { "type": "integer", "minimum": 0, "maximum": 256, "description": "Kept ready while creates come in (default: min)" },
                    "idle_secs": { "type": "integer", "minimum": 1, "default": 300, "description": "Back to min after this long without a create" } } } } } },
                "responses": with_errors(json!({ "200": json_response("The pool", schema_ref("Pool")) }), &["400", "401", "422"]) },
            "delete": { "summary": "Remove the pool and destroy its ready sandboxes", "responses": with_errors(json!({ "204": no_content("Removed") }), &["401", "404"]) } },
        "/v1/snapshots": { "get": {
            "summary": "List snapshots",
            "parameters": [param("sandbox", "query", false, json!({ "type": "string" }), "Only this sandbox's")],
            "responses": with_errors(json!({ "200": json_response("Snapshots, newest first", json!({ "type": "object", "properties": { "snapshots": { "type": "array", "items": schema_ref("Snapshot") } } })) }), &["401"]) } },
        "/v1/snapshots/{id}": { "parameters": [snap_param],
            "get": { "summary": "Inspect a snapshot", "responses": with_errors(json!({ "200": json_response("The snapshot", schema_ref("Snapshot")) }), &["401", "404"]) },
            "delete": { "summary": "Delete a snapshot (its layer goes with the last snapshot using it)", "responses": with_errors(json!({ "204": no_content("Deleted") }), &["401", "404"]) } }
    })
}

fn state_schemas() -> Value {
    json!({
        "Pool": { "type": "object", "properties": {
            "template": { "type": "string" }, "min": { "type": "integer" }, "max": { "type": "integer" }, "idle_secs": { "type": "integer" },
            "ready": { "type": "integer", "description": "Sandboxes ready to hand out" },
            "starting": { "type": "integer", "description": "Sandboxes being started for the pool" },
            "target": { "type": "integer", "description": "max while creates come in, min once idle" },
            "hits": { "type": "integer", "description": "Creates served from the pool" },
            "misses": { "type": "integer", "description": "Creates that found the pool empty and started cold" },
            "skipped": { "type": "integer", "description": "Creates the pool cannot serve: volumes, from_snapshot, secrets, or a disk size other than the default" },
            "refills": { "type": "integer" }, "refill_failures": { "type": "integer" },
            "refill_p50_ms": { "type": "number", "description": "Median time to start one pooled sandbox, over the last 64" },
            "last_error": { "type": "string" } } },
        "Snapshot": { "type": "object", "properties": {
            "id": { "type": "string" }, "sandbox_id": { "type": "string" }, "name": { "type": "string" },
            "created_at": { "type": "string", "format": "date-time" }, "template": { "type": "string" },
            "spec": { "$ref": "#/components/schemas/SandboxSpec" },
            "layer": { "type": "string", "description": "sha256 of the zstd-compressed layer" },
            "layer_bytes": { "type": "integer" }, "file_bytes": { "type": "integer" }, "entries": { "type": "integer" },
            "skipped": { "type": "array", "items": { "type": "string" } }, "skipped_count": { "type": "integer" },
            "frozen_ms": { "type": "integer" },
            "interpreter": { "type": "array", "items": { "type": "object", "properties": {
                "id": { "type": "string" }, "language": { "type": "string" }, "pickler": { "type": "string" },
                "saved": { "type": "array", "items": { "type": "string" } },
                "unsaved": { "type": "array", "items": { "type": "object", "properties": { "name": { "type": "string" }, "reason": { "type": "string" } } } } } } } } }
    })
}

fn base_document() -> Value {
    let all = ["400", "401", "404", "409", "502"];
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "corral",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Self-hosted sandboxes for AI agents. Every route except /v1/health needs `Authorization: Bearer <key>` (or `X-API-Key`). Errors are `{\"code\", \"message\"}`."
        },
        "security": [{ "bearer": [] }],
        "paths": {
            "/v1/health": { "get": {
                "summary": "Liveness check", "security": [],
                "responses": { "200": json_response("Daemon is up", json!({ "type": "object", "properties": { "status": { "type": "string" }, "version": { "type": "string" } } })) }
            }},
            "/v1/openapi.json": { "get": {
                "summary": "This document",
                "responses": with_errors(json!({ "200": json_response("OpenAPI document", json!({ "type": "object" })) }), &["401"])
            }},
            "/v1/sandboxes": {
                "post": {
                    "summary": "Create a sandbox (from the template's warm pool when it has one that matches; the `Server-Timing` header says `pool` or `cold` and the time spent in the daemon)", "requestBody": json_body("SandboxSpec"),
                    "responses": with_errors(json!({ "201": json_response("Created and running", schema_ref("SandboxInfo")) }), &["400", "401", "422", "500", "503"])
                },
                "get": {
                    "summary": "List sandboxes",
                    "parameters": [
                        param("state", "query", false, json!({ "type": "string" }), "Comma-separated states: running, paused, killed, exited; pooled (warm-pool sandboxes nobody owns yet) only when asked for"),
                        param("metadata.KEY", "query", false, json!({ "type": "string" }), "Only sandboxes whose metadata KEY equals this value; repeatable with other keys")
                    ],
                    "responses": with_errors(json!({ "200": json_response("Matching sandboxes, newest first", json!({ "type": "object", "properties": { "sandboxes": { "type": "array", "items": schema_ref("SandboxInfo") } } })) }), &["400", "401"])
                }
            },
            "/v1/sandboxes/{id}": {
                "parameters": [id_param()],
                "get": { "summary": "Get a sandbox", "responses": with_errors(json!({ "200": json_response("The sandbox", schema_ref("SandboxInfo")) }), &["401", "404"]) },
                "delete": { "summary": "Kill a sandbox (idempotent)", "responses": with_errors(json!({ "204": no_content("Killed") }), &["401", "404", "500"]) }
            },
            "/v1/sandboxes/{id}/timeout": {
                "parameters": [id_param()],
                "post": {
                    "summary": "Set the timeout: the sandbox is killed this long from now",
                    "requestBody": { "required": true, "content": { "application/json": { "schema": { "type": "object", "required": ["timeout"], "properties": { "timeout": { "oneOf": [{ "type": "integer", "minimum": 1 }, { "type": "string", "examples": ["10m"] }] } } } } } },
                    "responses": with_errors(json!({ "200": json_response("The sandbox with its new expiry", schema_ref("SandboxInfo")) }), &["400", "401", "404", "409", "422"])
                }
            },
            "/v1/sandboxes/{id}/metrics": {
                "parameters": [id_param()],
                "get": { "summary": "Resource usage", "responses": with_errors(json!({ "200": json_response("Usage from the sandbox's cgroup", schema_ref("ResourceUsage")) }), &["401", "404", "409"]) }
            },
            "/v1/sandboxes/{id}/exec": {
                "parameters": [id_param(), param("wait", "query", false, json!({ "type": "boolean" }), "Answer once with the buffered result instead of streaming")],
                "post": {
                    "summary": "Run a command",
                    "description": "Streams NDJSON events (or SSE with `Accept: text/event-stream`) as output arrives. Closing the connection kills a foreground process. With `background`, answers with the start event (or `{pid}` with wait) and the process keeps running.",
                    "requestBody": json_body("ExecRequest"),
                    "responses": with_errors(json!({
                        "200": {
                            "description": "Event stream, or with wait=true the result",
                            "content": {
                                "application/x-ndjson": { "schema": schema_ref("OutputEvent") },
                                "text/event-stream": { "schema": { "type": "string" } },
                                "application/json": { "schema": { "oneOf": [schema_ref("ExecResult"), { "type": "object", "properties": { "pid": { "type": "integer" } } }] } }
                            }
                        }
                    }), &all)
                }
            },
            "/v1/sandboxes/{id}/processes": {
                "parameters": [id_param()],
                "get": { "summary": "List processes started through exec", "responses": with_errors(json!({ "200": json_response("Processes", json!({ "type": "object", "properties": { "processes": { "type": "array", "items": schema_ref("ProcessInfo") } } })) }), &all) }
            },
            "/v1/sandboxes/{id}/processes/{pid}/signal": {
                "parameters": [id_param(), pid_param()],
                "post": {
                    "summary": "Send a signal",
                    "requestBody": { "required": true, "content": { "application/json": { "schema": { "type": "object", "required": ["signal"], "properties": { "signal": { "oneOf": [{ "type": "integer" }, { "type": "string", "examples": ["SIGTERM", "KILL"] }] } } } } } },
                    "responses": with_errors(json!({ "204": no_content("Sent") }), &all)
                }
            },
            "/v1/sandboxes/{id}/processes/{pid}/stdin": {
                "parameters": [id_param(), pid_param()],
                "post": {
                    "summary": "Write to a process's stdin (exec with stdin: true)",
                    "requestBody": { "required": true, "content": { "application/json": { "schema": { "type": "object", "required": ["data"], "properties": { "data": { "type": "string" } } } } } },
                    "responses": with_errors(json!({ "204": no_content("Written") }), &all)
                }
            },
            "/v1/sandboxes/{id}/processes/{pid}/stdin/close": {
                "parameters": [id_param(), pid_param()],
                "post": { "summary": "Close a process's stdin", "responses": with_errors(json!({ "204": no_content("Closed") }), &all) }
            },
            "/v1/sandboxes/{id}/processes/{pid}/output": {
                "parameters": [id_param(), pid_param()],
                "get": { "summary": "Attach: stream a running process's output from now on", "responses": with_errors(json!({ "200": event_stream("Output events until exit") }), &all) }
            },
            "/v1/sandboxes/{id}/files": {
                "parameters": [id_param(), path_query(), user_query()],
                "get": {
                    "summary": "Download a file",
                    "responses": with_errors(json!({ "200": { "description": "Raw contents", "content": { "application/octet-stream": { "schema": { "type": "string", "contentMediaType": "application/octet-stream" } } } } }), &all)
                },
                "put": {
                    "summary": "Upload a file (streamed; replaces an existing file)",
                    "parameters": [
                        param("mode", "query", false, json!({ "type": "string", "examples": ["0644"] }), "Octal permissions"),
                        param("append", "query", false, json!({ "type": "boolean" }), "Append instead of replacing")
                    ],
                    "requestBody": { "required": true, "content": { "application/octet-stream": { "schema": { "type": "string", "contentMediaType": "application/octet-stream" } } } },
                    "responses": with_errors(json!({ "200": json_response("The written file", schema_ref("FileEntry")) }), &["400", "401", "404", "409", "502", "507"])
                },
                "delete": { "summary": "Remove a file or directory", "responses": with_errors(json!({ "204": no_content("Removed") }), &all) }
            },
            "/v1/sandboxes/{id}/files/list": {
                "parameters": [id_param(), path_query(), user_query(), param("depth", "query", false, json!({ "type": "integer", "minimum": 1, "maximum": 32, "default": 1 }), "How deep to descend")],
                "get": { "summary": "List a directory", "responses": with_errors(json!({ "200": json_response("Entries", json!({ "type": "object", "properties": { "entries": { "type": "array", "items": schema_ref("FileEntry") } } })) }), &all) }
            },
            "/v1/sandboxes/{id}/files/stat": {
                "parameters": [id_param(), path_query(), user_query()],
                "get": { "summary": "Stat a path", "responses": with_errors(json!({ "200": json_response("The entry", schema_ref("FileEntry")) }), &all) }
            },
            "/v1/sandboxes/{id}/files/mkdir": {
                "parameters": [id_param()],
                "post": {
                    "summary": "Create a directory (and its parents)",
                    "requestBody": { "required": true, "content": { "application/json": { "schema": { "type": "object", "required": ["path"], "properties": { "path": { "type": "string" }, "user": { "type": "string" } } } } } },
                    "responses": with_errors(json!({ "200": json_response("The directory", schema_ref("FileEntry")), "204": no_content("Created") }), &all)
                }
            },
            "/v1/sandboxes/{id}/files/move": {
                "parameters": [id_param()],
                "post": {
                    "summary": "Rename or move a path",
                    "requestBody": { "required": true, "content": { "application/json": { "schema": { "type": "object", "required": ["from", "to"], "properties": { "from": { "type": "string" }, "to": { "type": "string" }, "user": { "type": "string" } } } } } },
                    "responses": with_errors(json!({ "200": json_response("The moved entry", schema_ref("FileEntry")), "204": no_content("Moved") }), &all)
                }
            },
            "/v1/sandboxes/{id}/files/watch": {
                "parameters": [id_param(), path_query(), user_query(), param("recursive", "query", false, json!({ "type": "boolean" }), "Watch subdirectories too")],
                "get": { "summary": "Watch for changes", "responses": with_errors(json!({ "200": { "description": "SSE: `event: fs` with `{kind, path}`; `event: error` with `{code, message}`", "content": { "text/event-stream": { "schema": { "type": "string" } } } } }), &all) }
            }
        },
        "components": {
            "securitySchemes": {
                "bearer": { "type": "http", "scheme": "bearer", "description": "The API key printed when the daemon first started (also accepted as `X-API-Key`)" }
            },
            "schemas": {
                "Error": { "type": "object", "required": ["code", "message"], "properties": {
                    "code": { "type": "string", "examples": ["bad_request", "unauthorized", "not_found", "conflict", "invalid", "internal", "insufficient_storage", "agent_error"] },
                    "message": { "type": "string" } } },
                "Size": { "oneOf": [{ "type": "integer", "minimum": 0 }, { "type": "string", "examples": ["512M", "1G"] }] },
                "SandboxSpec": { "type": "object", "additionalProperties": false, "properties": {
                    "template": { "type": "string", "default": "base" },
                    "cpus": { "type": "number", "default": 1, "minimum": 0.01, "maximum": 1024 },
                    "memory": { "$ref": "#/components/schemas/Size", "description": "8M to 64G, default 512M" },
                    "disk": { "$ref": "#/components/schemas/Size", "description": "1M to 256G, default 1G" },
                    "pids": { "type": "integer", "minimum": 8, "maximum": 65536, "default": 256 },
                    "env": { "type": "object", "additionalProperties": { "type": "string" } },
                    "metadata": { "type": "object", "additionalProperties": { "type": "string" } },
                    "timeout": { "type": "integer", "minimum": 1, "maximum": 2592000, "default": 300, "description": "Seconds until the sandbox is killed (or paused)" },
                    "on_timeout": { "type": "string", "enum": ["kill", "pause"], "default": "kill" },
                    "from_snapshot": { "type": "string", "description": "Start from this snapshot's files, settings and interpreter state; fields given here override its settings" },
                    "volumes": { "type": "array", "items": { "type": "object", "required": ["host", "path"], "properties": { "host": { "type": "string" }, "path": { "type": "string" }, "read_only": { "type": "boolean" } } } } } },
                "SandboxInfo": { "type": "object", "required": ["id", "template", "state", "limits", "metadata", "created_at", "expires_at", "timeout"], "properties": {
                    "id": { "type": "string" },
                    "template": { "type": "string" },
                    "state": { "type": "string", "enum": ["running", "paused", "killed", "exited", "pooled"] },
                    "paused_at": { "type": "string", "format": "date-time" },
                    "remaining_timeout": { "type": "integer", "description": "Seconds of timeout left, while paused" },
                    "on_timeout": { "type": "string", "enum": ["kill", "pause"] },
                    "limits": { "type": "object", "properties": { "cpus": { "type": "number" }, "memory": { "type": "integer" }, "disk": { "type": "integer" }, "pids": { "type": "integer" } } },
                    "metadata": { "type": "object", "additionalProperties": { "type": "string" } },
                    "created_at": { "type": "string", "format": "date-time" },
                    "expires_at": { "type": "string", "format": "date-time" },
                    "timeout": { "type": "integer" },
                    "ended_at": { "type": "string", "format": "date-time" },
                    "end_reason": { "type": "string", "examples": ["killed", "timeout", "exited", "shutdown", "daemon_restarted"] } } },
                "ResourceUsage": { "type": "object", "properties": {
                    "memory_bytes": { "type": "integer" }, "memory_limit_bytes": { "type": "integer" }, "cpu_usage_usec": { "type": "integer" },
                    "pids": { "type": "integer" }, "oom_kills": { "type": "integer" }, "pids_limit_hits": { "type": "integer" } } },
                "ExecRequest": { "type": "object", "additionalProperties": false, "properties": {
                    "argv": { "type": "array", "items": { "type": "string" }, "description": "Program and arguments; or use cmd" },
                    "cmd": { "type": "string", "description": "Shell command line run with /bin/sh -c" },
                    "env": { "type": "object", "additionalProperties": { "type": "string" } },
                    "cwd": { "type": "string" },
                    "user": { "type": "string", "description": "\"user\" (default), \"root\" or a numeric uid" },
                    "timeout": { "type": "number", "description": "Seconds; the process group is killed after this" },
                    "background": { "type": "boolean" },
                    "stdin": { "oneOf": [{ "type": "string", "description": "Sent, then stdin is closed" }, { "type": "boolean", "description": "true: keep stdin open for /processes/{pid}/stdin" }] },
                    "pty": { "type": "object", "required": ["cols", "rows"], "properties": { "cols": { "type": "integer" }, "rows": { "type": "integer" } } },
                    "tag": { "type": "string" } } },
                "OutputEvent": { "type": "object", "required": ["type"], "description": "One NDJSON line / SSE event", "properties": {
                    "type": { "type": "string", "enum": ["start", "stdout", "stderr", "exit", "error"] },
                    "pid": { "type": "integer", "description": "start" },
                    "data": { "type": "string", "description": "stdout/stderr as UTF-8 text" },
                    "data_b64": { "type": "string", "description": "stdout/stderr when not valid UTF-8" },
                    "exit_code": { "type": ["integer", "null"] },
                    "signal": { "type": ["integer", "null"] },
                    "reason": { "type": ["string", "null"], "description": "Why corral ended the process, e.g. timeout" },
                    "code": { "type": "string", "description": "error" },
                    "message": { "type": "string", "description": "error" } } },
                "ExecResult": { "type": "object", "properties": {
                    "pid": { "type": "integer" }, "stdout": { "type": "string" }, "stderr": { "type": "string" },
                    "stdout_b64": { "type": "string" }, "stderr_b64": { "type": "string" },
                    "exit_code": { "type": ["integer", "null"] }, "signal": { "type": ["integer", "null"] }, "reason": { "type": ["string", "null"] },
                    "truncated": { "type": "boolean", "description": "Output beyond 16 MiB per stream was dropped" } } },
                "ProcessInfo": { "type": "object", "properties": {
                    "pid": { "type": "integer" }, "argv": { "type": "array", "items": { "type": "string" } }, "cwd": { "type": ["string", "null"] },
                    "tag": { "type": ["string", "null"] }, "pty": { "type": "boolean" }, "env": { "type": "object", "additionalProperties": { "type": "string" } } } },
                "FileEntry": { "type": "object", "properties": {
                    "path": { "type": "string" }, "name": { "type": "string" }, "kind": { "type": "string", "enum": ["file", "dir", "symlink", "other"] },
                    "size": { "type": "integer" }, "mode": { "type": "integer" }, "uid": { "type": "integer" }, "gid": { "type": "integer" },
                    "modified": { "type": "integer", "description": "Seconds since the epoch" }, "symlink_target": { "type": ["string", "null"] } } }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_operation_has_responses_and_refs_resolve() {
        let doc = super::document();
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        let text = doc.to_string();
        for piece in text.split("#/components/schemas/").skip(1) {
            let name: String = piece.chars().take_while(|c| c.is_alphanumeric()).collect();
            assert!(schemas.contains_key(&name), "dangling $ref {name}");
        }
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("item") {
                if method != "parameters" {
                    assert!(op["responses"].is_object(), "{method} {path} has no responses");
                }
            }
        }
    }
}
