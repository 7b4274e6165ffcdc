//! One key opened once for a decision: read in place, written in place. The
//! crate's key types open a key once to read and again to write; a decision
//! costs Redis little more than its key lookups, so each is counted.

use std::os::raw::{c_char, c_longlong};
use std::ptr::NonNull;

use redis_module::{raw, Context, KeyType, RedisError, RedisString};

/// A key opened to be read and written, closed when dropped.
pub(crate) struct Key {
    ctx: *mut raw::RedisModuleCtx,
    key: NonNull<raw::RedisModuleKey>,
    /// How it was last written, if at all: only then is it signalled as
    /// modified (a denial changes nothing a `WATCH` or client-side cache
    /// should see), and its keyspace events sent.
    written: Option<Written>,
}

/// How a key was written, for its keyspace events.
#[derive(Clone, Copy)]
enum Written {
    /// Set with an expiry: `set` and `expire`, as `SET .. PXAT` sends.
    Set,
    /// Deleted: `del`.
    Deleted,
}

impl Key {
    pub(crate) fn open(ctx: &Context, name: &RedisString) -> Result<Self, RedisError> {
        let key = raw::open_key(
            ctx.ctx,
            name.inner,
            raw::KeyMode::READ | raw::KeyMode::WRITE,
        );
        NonNull::new(key)
            .map(|key| Self {
                ctx: ctx.ctx,
                key,
                written: None,
            })
            .ok_or(RedisError::Str("RLFAIL the key could not be opened"))
    }

    pub(crate) fn kind(&self) -> KeyType {
        // SAFETY: an open key of this context.
        unsafe { raw::RedisModule_KeyType.unwrap()(self.key.as_ptr()) }.into()
    }

    /// The value of a string key, read in place; `None` for another type or
    /// no key.
    pub(crate) fn value(&self) -> Option<&[u8]> {
        if self.kind() != KeyType::String {
            return None;
        }
        let mut len = 0;
        let data = raw::string_dma(self.key.as_ptr(), &mut len, raw::KeyMode::READ);
        if data.is_null() {
            return None;
        }
        // SAFETY: Redis hands out `len` bytes at `data`, valid while the key
        // is open and unchanged: the shared borrow of `self` keeps it open,
        // and every write takes `&mut self`.
        Some(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) })
    }

    /// Sets the key to `value` expiring at `at` (Unix time in ms), as `SET
    /// .. PXAT` does: the very instant replicas and the AOF are sent, where
    /// an expiry relative to the server's own clock could differ from it (by
    /// however long a script or transaction had run, on a server that reads
    /// its clock once for each). A string already there is rewritten in
    /// place: no new object, and no second lookup of the key. (Reading a
    /// string in place makes Redis keep it as a plain string: a bare number
    /// `SET` stores as an integer takes a string's room once the module has
    /// read it.)
    pub(crate) fn set(&mut self, value: &[u8], at: u64) -> Result<(), RedisError> {
        if !(self.kind() == KeyType::String && self.rewrite(value)) {
            self.replace(value)?;
        }
        self.written = Some(Written::Set);
        let at = c_longlong::try_from(at).unwrap_or(c_longlong::MAX);
        // SAFETY: an open key of this context, opened for writing. The
        // function exists from Redis 6.2 on; the module loads on 7.0 and up.
        let set =
            unsafe { raw::RedisModule_SetAbsExpire.map(|set_abs| set_abs(self.key.as_ptr(), at)) };
        match set.map(raw::Status::from) {
            Some(raw::Status::Ok) => Ok(()),
            _ => Err(RedisError::Str("RLFAIL the key's expiry could not be set")),
        }
    }

    /// Rewrites the string in place; `false` when Redis would not (then
    /// nothing was changed but, possibly, its length).
    fn rewrite(&mut self, value: &[u8]) -> bool {
        let key = self.key.as_ptr();
        if raw::string_truncate(key, value.len()) != raw::Status::Ok {
            return false;
        }
        let mut len = 0;
        let data = raw::string_dma(key, &mut len, raw::KeyMode::WRITE);
        if data.is_null() || len != value.len() {
            return false;
        }
        // SAFETY: Redis hands out `len` writable bytes at `data`, which no
        // other reference reaches (`&mut self`).
        unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), data.cast::<u8>(), len) };
        true
    }

    /// Replaces the key's value with a new string holding `value`.
    fn replace(&mut self, value: &[u8]) -> Result<(), RedisError> {
        // SAFETY: a string made in this context, freed once set (the key
        // keeps its own reference).
        unsafe {
            let string = raw::RedisModule_CreateString.unwrap()(
                self.ctx,
                value.as_ptr().cast::<c_char>(),
                value.len(),
            );
            let set = raw::string_set(self.key.as_ptr(), string);
            raw::RedisModule_FreeString.unwrap()(self.ctx, string);
            if set == raw::Status::Err {
                return Err(RedisError::Str("RLFAIL the key could not be written"));
            }
        }
        Ok(())
    }

    pub(crate) fn delete(&mut self) {
        // SAFETY: an open key of this context, opened for writing.
        unsafe { raw::RedisModule_DeleteKey.unwrap()(self.key.as_ptr()) };
        self.written = Some(Written::Deleted);
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        // SAFETY: opened by `open`, closed once; the name is the key's own,
        // and the events' names are C strings.
        unsafe {
            if let Some(written) = self.written {
                let name =
                    raw::RedisModule_GetKeyNameFromModuleKey.unwrap()(self.key.as_ptr()).cast_mut();
                raw::RedisModule_SignalModifiedKey.unwrap()(self.ctx, name);
                // The events the function's `SET .. PX` and `DEL` send, so
                // that listeners see the same writes on either path (the key
                // API sends none of its own). Only those of the classes
                // `notify-keyspace-events` enables: sent regardless, they
                // cost Redis 2.5% of a decision with none enabled.
                let enabled = raw::RedisModule_GetNotifyKeyspaceEvents.map_or(0, |get| get());
                let notify = raw::RedisModule_NotifyKeyspaceEvent.unwrap();
                let send = |class: raw::NotifyEvent, event: &std::ffi::CStr| {
                    if enabled & class.bits() != 0 {
                        notify(self.ctx, class.bits(), event.as_ptr(), name);
                    }
                };
                match written {
                    Written::Set => {
                        send(raw::NotifyEvent::STRING, c"set");
                        send(raw::NotifyEvent::GENERIC, c"expire");
                    }
                    Written::Deleted => send(raw::NotifyEvent::GENERIC, c"del"),
                }
            }
            raw::RedisModule_CloseKey.unwrap()(self.key.as_ptr());
        }
    }
}

/// Keys are signalled as modified when written, not whenever one opened for
/// writing is closed (see [`Key`]): set when the module loads.
pub(crate) fn signal_writes_only(ctx: &Context) {
    ctx.set_module_options(redis_module::raw::ModuleOptions::NO_IMPLICIT_SIGNAL_MODIFIED);
}
