#!/bin/sh
echo "bazel coverage is not supported in cohort's offline build (no coverage tools are installed)" >&2
exit 1
