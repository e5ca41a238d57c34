// node-postgres (`pg`) against `pulpitum serve`: a second driver family. Run by
// tests/server.rs with the port as the first argument and the password in PGPASSWORD;
// exits non-zero with the failing check on stderr.
const assert = require("assert");
const { Client } = require("pg");

async function main() {
  const client = new Client({
    host: "127.0.0.1",
    port: Number(process.argv[2]),
    user: "alice",
    database: "pulpitum",
    password: process.env.PGPASSWORD,
  });
  await client.connect();
  // A named prepared statement, run twice with different parameters.
  const page = {
    name: "latest",
    text: "SELECT id, content FROM chat WHERE channel_id = $1 ORDER BY timestamp DESC, id DESC LIMIT 3",
  };
  let r = await client.query({ ...page, values: [1] });
  assert.deepStrictEqual(r.rows.map((x) => x.id), ["31", "30", "29"]);
  r = await client.query({ ...page, values: [2] });
  assert.deepStrictEqual(r.rows.map((x) => x.content), ["day 31", "day 30", "day 29"]);
  // The oldest rows live in the archive.
  r = await client.query("SELECT min(id) AS lo, count(*) AS n FROM chat WHERE channel_id = $1", [1]);
  assert.deepStrictEqual(r.rows[0], { lo: "1", n: "31" });
  // Errors carry SQLSTATEs.
  await assert.rejects(client.query("SELEC 1"), (e) => e.code === "42601");
  await assert.rejects(client.query("SELECT * FROM nope"), (e) => e.code === "42P01");
  await client.end();
  console.log("node-postgres ok");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
