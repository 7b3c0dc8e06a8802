"""The one exception cohort_client raises, carrying a gRPC status code's name."""


class CohortError(Exception):
    """A failed call or a bad input.

    code:    the gRPC status code's name, as the C++ client and the CLI print it: "UNAUTHENTICATED",
             "PERMISSION_DENIED", "NOT_FOUND", "INVALID_ARGUMENT", "UNAVAILABLE", "DEADLINE_EXCEEDED"...
    message: what went wrong and what to do.
    rpc:     the method, e.g. "Coordinator.SubmitJob"; empty for local errors (a credentials file,
             a job spec).
    """

    def __init__(self, code, message, rpc=""):
        self.code = code
        self.message = message
        self.rpc = rpc
        super().__init__(f"{rpc}: {code}: {message}" if rpc else f"{code}: {message}")
