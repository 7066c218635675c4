#!/bin/sh
# Makes a throwaway CA, a server certificate for "localhost" and a client certificate that it
# signs, plus an unrelated CA with its own server and client certificates (next_*: what a
# renewal brings), for the TLS, mTLS and rotation tests. Usage: make_test_certs.sh OUT_DIR
set -eu
out=$1
days=3650
for ca in ca other_ca; do
  openssl req -x509 -newkey rsa:2048 -nodes -subj "/CN=tandem-test-$ca" -days $days \
    -keyout "$out/$ca.key" -out "$out/$ca.pem" 2>/dev/null
done
# sign CA NAME: a certificate for localhost named NAME, signed by CA.
sign() {
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$2" -keyout "$out/$2.key" \
    -out "$out/$2.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$out/$2.ext"
  openssl x509 -req -in "$out/$2.csr" -CA "$out/$1.pem" -CAkey "$out/$1.key" \
    -CAcreateserial -days $days -extfile "$out/$2.ext" -out "$out/$2.pem" 2>/dev/null
}
sign ca server
sign ca client
sign other_ca next_server
sign other_ca next_client
