#!/bin/sh
# Makes a throwaway CA, a server certificate for "localhost" and a client certificate that it
# signs, plus an unrelated CA, for the TLS and mTLS tests. Usage: make_test_certs.sh OUT_DIR
set -eu
out=$1
days=3650
for ca in ca other_ca; do
  openssl req -x509 -newkey rsa:2048 -nodes -subj "/CN=tandem-test-$ca" -days $days \
    -keyout "$out/$ca.key" -out "$out/$ca.pem" 2>/dev/null
done
for who in server client; do
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$who" -keyout "$out/$who.key" \
    -out "$out/$who.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$out/$who.ext"
  openssl x509 -req -in "$out/$who.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
    -CAcreateserial -days $days -extfile "$out/$who.ext" -out "$out/$who.pem" 2>/dev/null
done
