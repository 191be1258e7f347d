#!/usr/bin/env bash
# System packages the tests use: kcat (librdkafka's CLI client), tcpdump (the pcap
# import test), a Java runtime (PySpark, for trio-broker verify), FUSE 3 (fusermount3
# and libfuse3, for the power-loss filesystem in tests/faultfs) and Maven with a JDK
# (the Java client tests in tests/jvm; Maven caches in ~/.m2), and Apache ZooKeeper
# (cluster mode: tests/cluster and `trio-broker cluster up`), and Chromium with its
# WebDriver (the web console's browser test, tests/e2e/test_console_browser.py).
set -euo pipefail
need=()
command -v kcat >/dev/null 2>&1 || need+=(kcat)
command -v tcpdump >/dev/null 2>&1 || need+=(tcpdump)
command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
command -v javac >/dev/null 2>&1 || need+=(default-jdk-headless)
command -v mvn >/dev/null 2>&1 || need+=(maven)
[ -f /usr/share/java/zookeeper.jar ] || need+=(zookeeper)
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
ldconfig -p 2>/dev/null | grep 'libfuse3\.so\.3' >/dev/null || need+=(libfuse3-3)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
