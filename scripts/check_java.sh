#!/usr/bin/env bash
# TorchServe's frontend is a Java program: fail early, with the fix, when Java is missing.
java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
if ! command -v "$java_bin" >/dev/null 2>&1; then
  echo "error: Java 17 is required by TorchServe's frontend and was not found." >&2
  echo "       Debian/Ubuntu: apt-get install -y openjdk-17-jdk-headless (or set JAVA_HOME)" >&2
  exit 1
fi
major=$("$java_bin" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
if [ -n "$major" ] && [ "$major" -lt 11 ]; then
  echo "error: Java $major found; TorchServe 0.12 needs Java 11 or newer (17 recommended)." >&2
  exit 1
fi
