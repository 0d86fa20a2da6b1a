#!/usr/bin/env bash
# What the real-QuestDB tests need: Java 17 (QuestDB's jar), Maven (to fetch it from Maven
# Central), psql (a real pgwire client) and xfsprogs (volumes of a real size, the gp3-xfs
# StorageClass: mkfs.xfs, xfs_growfs). Installs what is missing from Debian's packages when
# it can (root and apt-get), then fetches the QuestDB versions the tests run into ~/.m2 once,
# with a line per version. Prints what it could not do and exits non-zero: the tests that need
# a real database would fail with the same message.
set -euo pipefail

# 9.3.2: the version the failed-upgrade test and the downtime bench upgrade to (it refuses a key
# 9.2.0 reads and exits at start); fetched here so that its "image pull" takes no test's timeout.
VERSIONS=(9.1.0 9.2.0 9.3.2)
missing=()
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || missing+=(maven)
command -v psql >/dev/null || missing+=(postgresql-client)
command -v mkfs.xfs >/dev/null || missing+=(xfsprogs)
if ((${#missing[@]})); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        echo "questdb: installing ${missing[*]} from Debian's packages"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null ||
            { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null; }
    else
        echo "questdb: missing ${missing[*]} (install them: the real-QuestDB tests need Java 17, Maven, psql and xfsprogs)" >&2
        exit 1
    fi
fi
java -version 2>&1 | head -1
for v in "${VERSIONS[@]}"; do
    jar="$HOME/.m2/repository/org/questdb/questdb/$v/questdb-$v.jar"
    if [[ -f "$jar" ]]; then
        echo "questdb $v: $jar (cached)"
        continue
    fi
    started=$(date +%s)
    echo "questdb $v: fetching org.questdb:questdb:$v from Maven Central (~29 MB, once)"
    # The local repository named: Java takes user.home from the passwd entry, not $HOME.
    mvn -q -B dependency:get -Dmaven.repo.local="$HOME/.m2/repository" \
        -Dartifact="org.questdb:questdb:$v" -Dtransitive=false
    echo "questdb $v: fetched in $(($(date +%s) - started)) s"
done
