#!/usr/bin/env bash
# layers.sh - refuses an #include that goes the wrong way between the floors
# of src/ (docs/architecture.md): base < core < store | front, store and
# front never include each other, main.c may include anything.  Every
# project include names its floor ("core/decide.h"); the generated
# protocol headers (*.pb-c.h) are the only bare names.  The pure core and
# the base floor include no hiredis, libmicrohttpd or nghttp2 header.
# Prints each offence as FILE:LINE and exits 1 if there is one.
set -u
cd "${1:-.}" || exit 2
allowed_base="base"
allowed_core="base core"
allowed_store="base core store"
allowed_front="base core front"
bad=0 n=0
for layer in base core store front; do
	eval "allowed=\$allowed_$layer"
	for f in src/$layer/*.[ch]; do
		[ -e "$f" ] || continue
		while IFS=: read -r line text; do
			n=$((n + 1))
			inc=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]([^>"]+)[>"].*/\1/' <<<"$text")
			case "$text" in
			*'<'*)
				case "$layer:$inc" in
				base:hiredis*|base:microhttpd*|base:nghttp2*|\
				core:hiredis*|core:microhttpd*|core:nghttp2*)
					echo "$f:$line: the $layer floor includes <$inc>"
					bad=1 ;;
				esac
				continue ;;
			esac
			case "$inc" in
			*.pb-c.h) continue ;;
			*/*) target=${inc%%/*} ;;
			*)
				echo "$f:$line: \"$inc\" does not name its floor"
				bad=1; continue ;;
			esac
			case " $allowed " in
			*" $target "*) ;;
			*)
				echo "$f:$line: $layer includes $inc ($target)"
				bad=1 ;;
			esac
		done < <(grep -n -E '^[[:space:]]*#[[:space:]]*include' "$f")
	done
done
echo "layers: $n includes read, $([ $bad = 0 ] && echo none || echo some) going the wrong way"
exit $bad
