// The test page's development token, free of the DOM (tests/js runs it under node).
// A token is reused only while it has more than `marginMs` to live; `drop()` forgets
// it (the server refused it: expired, or signed by a server process that has since
// restarted with a new development secret), and `refreshDelay()` says when to replace
// it on the open connection (auth.refresh) before the server closes 4001.

/** The `exp` claim of a JWT in ms since the epoch, or null when it cannot be read. */
export function tokenExpiry(token) {
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const exp = JSON.parse(atob(part + "=".repeat((4 - (part.length % 4)) % 4))).exp;
    return typeof exp === "number" ? exp * 1000 : null;
  } catch {
    return null;
  }
}

export class TokenCache {
  /**
   * @param {{fetchToken: () => Promise<string>, now?: () => number, marginMs?: number}} how
   */
  constructor({ fetchToken, now = () => Date.now(), marginMs = 30_000 }) {
    Object.assign(this, { fetchToken, now, marginMs });
    /** @type {string|null} */ this.token = null;
    /** @type {number|null} */ this.expiresAt = null;
    /** @type {Promise<string>|null} one request at a time */ this.asking = null;
  }

  /** The cached token while it has more than the margin to live; otherwise a new one. */
  async get() {
    if (this.token && (this.expiresAt === null || this.expiresAt - this.now() > this.marginMs)) {
      return this.token;
    }
    this.asking ??= this.fetchToken().then((token) => {
      this.token = token;
      this.expiresAt = tokenExpiry(token);
      return token;
    }).finally(() => { this.asking = null; });
    return this.asking;
  }

  /** Forget the token: the next `get()` asks for a new one. */
  drop() {
    this.token = null;
    this.expiresAt = null;
  }

  /**
   * Milliseconds until the token should be replaced: the margin before it expires,
   * but at least half its remaining life (a short-lived token); null when unknown.
   */
  refreshDelay() {
    if (this.expiresAt === null) return null;
    const left = Math.max(0, this.expiresAt - this.now());
    return Math.max(left - this.marginMs, left / 2);
  }
}

/**
 * Keep a client's token fresh: after each welcome, replace it on the open connection
 * (auth.refresh) when `tokens.refreshDelay()` says; forget it when the server refuses
 * it (an `invalid_token` error, a 4001 close), so the reconnect asks for a new one.
 * @param {import("./client.js").CowriteClient} client
 * @param {TokenCache} tokens
 */
export function keepTokenFresh(client, tokens, { setTimer = setTimeout, clearTimer = clearTimeout } = {}) {
  let timer = null;
  const schedule = () => {
    clearTimer(timer);
    const delay = tokens.refreshDelay();
    if (delay === null) return;
    timer = setTimer(async () => {
      if (client.state !== "open") return; // the next connection's welcome schedules again
      tokens.drop();
      try {
        await client.refreshAuth(await tokens.get());
        schedule();
      } catch { /* the server closes 4001 at expiry; the reconnect asks for a new token */ }
    }, delay);
  };
  client.addEventListener("welcome", schedule);
  client.addEventListener("error", ({ detail }) => { if (detail.code === "invalid_token") tokens.drop(); });
  client.addEventListener("state", ({ detail }) => { if (detail.action === "reauth") tokens.drop(); });
}
