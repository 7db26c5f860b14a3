/**
 * A reader of server-sent events (the `text/event-stream` format of the
 * WHATWG HTML standard, §9.2): `event:`, `id:` and `data:` fields, events
 * ended by a blank line, comment lines (`:` first) skipped.
 */

/** One event as it came: its name (default `message`), id (if any) and data text. */
export interface RawEvent {
  event: string;
  id?: string;
  data: string;
}

/** The events of a response body, in order, until the body ends. */
export async function* readEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<RawEvent> {
  const reader = body.getReader();
  const decoder = new TextDecoder("utf-8");
  let buf = "";
  let event = "message";
  let id: string | undefined;
  let data: string[] = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      buf += decoder.decode(value, { stream: !done });
      if (done) break;
      let nl: number;
      while ((nl = buf.search(/\r\n|\r|\n/)) >= 0) {
        // A lone CR at the end may be the first half of a CRLF: wait for more.
        if (buf[nl] === "\r" && nl === buf.length - 1) break;
        const line = buf.slice(0, nl);
        buf = buf.slice(buf[nl] === "\r" && buf[nl + 1] === "\n" ? nl + 2 : nl + 1);
        if (line === "") {
          if (data.length > 0) yield { event, id, data: data.join("\n") };
          event = "message";
          id = undefined;
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? "" : line.slice(colon + 1);
        if (val.startsWith(" ")) val = val.slice(1);
        if (field === "event") event = val;
        else if (field === "data") data.push(val);
        else if (field === "id") id = val;
      }
    }
  } finally {
    reader.releaseLock();
    await body.cancel().catch(() => undefined);
  }
}
