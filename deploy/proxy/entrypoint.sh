#!/bin/sh
# bert-serve-proxy's entrypoint: write the server's config from the templates, run nginx in the
# foreground, and turn SIGTERM into a stop that refuses nothing.
#
# - Each /etc/nginx/templates/NAME.template becomes /etc/nginx/conf.d/NAME with envsubst of the
#   variables whose names match NGINX_ENVSUBST_FILTER (an extended regular expression; every
#   variable when unset), as nginx's own images do: here the key, ${BERT_SERVE_PROXY_KEY}.
# - On SIGTERM (or SIGINT) nginx keeps accepting and forwarding for
#   BERT_SERVE_PROXY_STOP_DELAY_S seconds (default 10: the Service's endpoints drop a deleted
#   pod a few seconds late), then gets SIGQUIT: it closes its listener and exits once every
#   request it accepted is answered. The container exits with nginx's status.
set -u
templates="${NGINX_TEMPLATES_DIR:-/etc/nginx/templates}"
out="${NGINX_CONF_D:-/etc/nginx/conf.d}"
filter="${NGINX_ENVSUBST_FILTER:-.*}"
names=$(awk -v filter="$filter" 'END { for (name in ENVIRON) if (name ~ filter) printf "${%s} ", name }' </dev/null)
for template in "$templates"/*.template; do
    [ -e "$template" ] || continue
    name=$(basename "$template" .template)
    envsubst "$names" <"$template" >"$out/$name" || exit 1
done

delay="${BERT_SERVE_PROXY_STOP_DELAY_S:-10}"
nginx="${NGINX:-nginx}"
stopping=""
stop() {
    stopping=1
    echo "bert-serve-proxy: stopping in ${delay} s; accepting until then" >&2
    sleep "$delay"
    kill -QUIT "$server" 2>/dev/null
}
trap stop TERM INT
"$nginx" -g 'daemon off;' &
server=$!
wait "$server"
status=$?
# A trapped signal ends that wait early (status > 128): wait for nginx itself.
while [ -n "$stopping" ] && kill -0 "$server" 2>/dev/null; do
    wait "$server"
    status=$?
done
exit "$status"
