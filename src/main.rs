fn main() {
    use kube::CustomResourceExt;
    println!("{}", serde_json::to_string_pretty(&questdb_operator::api::QuestDB::crd()).unwrap());
}
