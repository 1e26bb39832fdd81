//! Provider errors as gRPC statuses. cluster-autoscaler gives a meaning only to UNIMPLEMENTED
//! (and only on the optional calls); every other code is a plain failure to it, but the code
//! still tells a person reading its log, and any other client, what kind of failure it was.

use tonic::{Code, Status};

use crate::provider::{ErrorKind, ProviderError};

/// The status code of an error kind.
pub fn code_of(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::FailedPrecondition => Code::FailedPrecondition,
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::Conflict => Code::Aborted,
        ErrorKind::Unsupported => Code::Unimplemented,
        ErrorKind::Internal => Code::Internal,
    }
}

/// The status a failed call answers with; the message is the error with its causes.
pub fn to_status(error: ProviderError) -> Status {
    let code = code_of(error.kind());
    let mut message = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    match code {
        Code::Internal | Code::Unavailable => tracing::warn!(?code, %message, "call failed"),
        _ => tracing::info!(?code, %message, "call refused"),
    }
    Status::new(code, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_code() {
        let table = [
            (ErrorKind::InvalidArgument, Code::InvalidArgument),
            (ErrorKind::NotFound, Code::NotFound),
            (ErrorKind::FailedPrecondition, Code::FailedPrecondition),
            (ErrorKind::Unavailable, Code::Unavailable),
            (ErrorKind::Conflict, Code::Aborted),
            (ErrorKind::Unsupported, Code::Unimplemented),
            (ErrorKind::Internal, Code::Internal),
        ];
        for (kind, code) in table {
            assert_eq!(code_of(kind), code, "{kind:?}");
        }
    }

    #[test]
    fn the_message_says_what_was_refused() {
        let status = to_status(ProviderError::NothingCancelable {
            group: "pool".into(),
            requested: 1,
            cancelled: 0,
            booting: 2,
            ready: 1,
            pinned: 1,
        });
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().contains("2 booting, 1 ready"), "{}", status.message());
        assert!(status.message().contains("1 pending claim(s) are pins"), "{}", status.message());
    }
}
